"""Where the bytes of a dataset come from: local files or object storage, behind one interface.

Its modules read objects and byte ranges and know nothing of the Atlas format, except
``_dataset``, which reads a dataset's files through them for the readers and the command line
(imports run one way: the format's module never imports this package). Writing to object
storage can build on the same calls.

The interface
-------------
``Location(url_or_path, storage_options=None)``
    A folder of objects: ``s3://bucket/prefix``, ``gs://``, ``az://``, ``http(s)://host/path``,
    any other fsspec scheme (``hf://`` ...), or a local directory (a path or ``file://`` URL).
    ``child(name)`` is a folder under it, ``object(name)`` an object in it. Pickles as its URL
    and options: the client is made lazily in each process and never used across ``fork``.
``StoredObject``
    ``read(limit=None)`` the whole object; ``read_range(start, end)`` exactly those bytes;
    ``read_ranges(ranges)`` several, neighbours merged into large requests made concurrently.
    The first answer pins the object (its ETag, sent as If-Match from then on, and its size):
    a later answer of another version raises ``ObjectChangedError``.
``BlockFetcher(obj, offsets, shard=None, cache=None)``
    The blocks of one object by exact ranges: ``get(b)``, ``prefetch(blocks)`` (a batch,
    neighbours merged), and a bounded read-ahead for passes in order. ``cache``, a
    ``_diskcache.DiskCache``, keeps the blocks fetched on local disk (``cache_dir=``).

Failures
--------
Connection errors, resets, timeouts, 5xx, 429/SlowDown and short bodies are retried with
jittered exponential backoff within the deadline, a short body resumed from its last byte;
what still fails raises ``StorageError`` (an ``OSError``) naming the URL, the shard and block
when known, and the attempts made. ``ObjectNotFoundError`` (also a ``FileNotFoundError``): no
such object or bucket. Access denied (bad credentials) is a ``StorageError`` at once.

Settings
--------
Engine settings come from the standard environment variables (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; an ``http://`` endpoint is plain HTTP;
GOOGLE_SERVICE_ACCOUNT / GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT_NAME,
AZURE_STORAGE_ACCOUNT_KEY ...) and from ``storage_options``, which override them: obstore's
configuration keys for s3/gs/az/http (``endpoint``, ``access_key_id``, ``secret_access_key``,
``region``, ``client_options={"allow_http": True}`` ...), the filesystem's arguments for fsspec
schemes. ``storage_options`` also takes the reading settings of ``Settings``: ``deadline``,
``max_attempts``, ``requests_in_flight``, ``read_ahead_bytes``, ``request_bytes``,
``merge_gap``.
"""

from .._errors import ObjectChangedError, ObjectNotFoundError, StorageError
from ._blocks import BlockFetcher, read_ahead_held
from ._object import Location, Settings, StoredObject, merge_ranges
from ._url import is_url, join_url, local_path, parse_url

__all__ = [
    "Location",
    "StoredObject",
    "BlockFetcher",
    "Settings",
    "StorageError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "is_url",
    "local_path",
    "parse_url",
    "join_url",
    "merge_ranges",
    "read_ahead_held",
]
