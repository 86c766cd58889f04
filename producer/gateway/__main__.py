from producer.gateway.main import main

raise SystemExit(main())
