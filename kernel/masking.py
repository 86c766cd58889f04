"""One way to show what may carry a secret: a URL, a query string, a line of text.

Every place rerankq shows a URL or writes a line that may hold one goes through here: the
store errors and commands' messages (``mask_url``), ``rerankq config``, the worker's log
lines and the gateway's access log (``mask_text``). So a secret masked in one place is
masked in all of them:

- a URL's user info: ``redis://user:***@host``, ``https://***@host`` (a bare user name may
  be a token); for a multi-host URL (``redis+sentinel://:a@h1:26379,:b@h2:26379/svc``) each
  host's credentials;
- the value of any query parameter whose name looks secret (``parameter_is_secret``):
  ``api_key``, ``x_api_key``, ``X-Api-Key``, ``token``, ``bearer``, ``key[]``, ``password``,
  ``sentinel_password``, ``signature``, ... as ``***``; the name is read decoded
  (``api%5Fkey`` is ``api_key``), the rest of the query is kept as it was written;
- a ``Bearer`` token: ``Bearer ***``.

Masking errs on the side of hiding: a parameter named ``monkey`` is masked too.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

#: What a query parameter's (decoded) name holds when its value is a secret.
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|auth|bearer|sig|credential|session|cookie", re.IGNORECASE)
#: A URL inside text: a scheme, ``://`` and everything up to white space or a quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]*")
#: A query parameter outside a URL (an access log's ``/path?api_key=...``).
_PARAMETER = re.compile(r"(?<=[?&;])([^=&;#\s]+)=([^&;#\s'\"]*)")
#: One host of a multi-host URL's list.
_HOST_PORT = re.compile(r"(?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}")
#: A URL's authority: up to its path, query or fragment.
_AUTHORITY = re.compile(r"[^/?#]*")
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-~+/=]+", re.IGNORECASE)
#: What each pattern above needs to match at all: one cheap search spares most lines every sub.
_MAY_HOLD_SECRET = re.compile(r"://|bearer|[?&;][^=&;#\s]+=", re.IGNORECASE)
MASK = "***"


def parameter_is_secret(name: str) -> bool:
    """Whether a query parameter (or a field) of this name carries a secret."""
    return bool(_SECRET_NAME.search(unquote_plus(name)))


def mask_query(query: str) -> str:
    """``a=1&api_key=x;key[]=y`` with every secret parameter's value as ``***``; all else as written."""
    parts = re.split(r"([&;])", query)
    for i in range(0, len(parts), 2):
        name, equals, _ = parts[i].partition("=")
        if equals and parameter_is_secret(name):
            parts[i] = f"{name}={MASK}"
    return "".join(parts)


def _mask_location(location: str) -> str:
    """``user:pw@host`` as ``user:***@host``; the credentials of every host of a multi-host URL."""
    if "@" not in location:
        return location
    userinfo, _, hosts = location.rpartition("@")
    if "," not in userinfo:
        return _credentials(userinfo) + "@" + hosts
    # redis+sentinel://:a@h1:26379,:b@h2:26379: each earlier host's credentials end at its "@";
    # what follows the last comma is the last host's credentials.
    *earlier, last = userinfo.split(",")
    shown = []
    for item in earlier:
        credentials, at, host = item.rpartition("@")
        if at:
            shown.append(_credentials(credentials) + "@" + host)
        else:
            # A host of the list (host:port), or a piece of a password holding a raw comma.
            shown.append(item if _HOST_PORT.fullmatch(item) else MASK)
    return ",".join([*shown, _credentials(last) + "@" + hosts])


def _credentials(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def mask_url(url: str | None) -> str:
    """``url`` as it may be shown: credentials and secret query values as ``***``.

    Works for multi-host URLs, which ``urllib`` cannot parse whole. Anything that is not a
    URL at all is ``***``: it could be anything, a bare password included.
    """
    if not url:
        return "(not set)"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return MASK
    found = _AUTHORITY.match(rest)
    authority = found.group() if found else ""
    tail = rest[len(authority) :]
    before_fragment, hash_, fragment = tail.partition("#")
    path, question, query = before_fragment.partition("?")
    return f"{scheme}://{_mask_location(authority)}{path}{question}{mask_query(query)}{hash_}{fragment}"


def mask_text(text: str) -> str:
    """A line of text with every URL in it masked (``mask_url``), every secret query value
    outside one (``/path?api_key=***``) and every ``Bearer`` token."""
    if not _MAY_HOLD_SECRET.search(text):
        return text
    text = _URL.sub(lambda m: mask_url(m.group()), text)
    text = _PARAMETER.sub(lambda m: f"{m[1]}={MASK}" if parameter_is_secret(m[1]) else m.group(), text)
    return _BEARER.sub(rf"\1{MASK}", text)
