from producer.exporter.main import main

raise SystemExit(main())
