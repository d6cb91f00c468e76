"""The engines that move bytes: obstore (S3, GCS, Azure, HTTP), fsspec (other schemes) and the
local file system. Each does one GET at a time and sorts its failures into the kinds the
retrying layer (``_object``) acts on; none retries on its own.

An engine is made lazily, in the process that uses it, and never crosses a fork: obstore's
runtime and fsspec's event loop are not fork-safe, so a forked child drops the parent's
engines (``atlas_fast._fork``) and makes its own on first use.
"""

from __future__ import annotations

import os
import re
import threading

from .._fork import after_fork_in_child

__all__ = [
    "Response",
    "NotFound",
    "Denied",
    "Changed",
    "Transient",
    "Fatal",
    "engine_for",
    "check_location",
    "ENGINE_KEYS",
]

# Keys of storage_options that are ours (how reading behaves), not the engine's.
ENGINE_KEYS = (
    "deadline",
    "max_attempts",
    "requests_in_flight",
    "read_ahead_bytes",
    "request_bytes",
    "merge_gap",
)


class Response:
    """One answer: the object's total ``size``, its ``etag`` (None if the engine has none) and
    the body as an iterator of byte chunks (what was asked for)."""

    __slots__ = ("size", "etag", "chunks")

    def __init__(self, size: int, etag, chunks) -> None:
        self.size = size
        self.etag = etag
        self.chunks = chunks


class _Failure(Exception):
    """A failed request, sorted by kind; ``detail`` is the engine's own words, shortened."""

    def __init__(self, detail: str, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code


class NotFound(_Failure):
    """No such object (``code``: "NoSuchBucket" when the bucket itself is missing)."""


class Denied(_Failure):
    """Credentials refused or access denied: retrying will not help."""


class Changed(_Failure):
    """The object is not the version pinned (a failed If-Match, or a range past its end)."""


class Transient(_Failure):
    """Connection errors, timeouts, 5xx, throttling, short bodies: worth retrying."""


class Fatal(_Failure):
    """Anything else that retrying will not fix (a bad request, a bad configuration)."""


_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- obstore --------------------------------------------------------------------------------


class ObstoreEngine:
    """obstore (Rust object_store): S3, GCS, Azure and plain HTTP(S). Its calls release the GIL.

    Built from the standard environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP; GOOGLE_*; AZURE_STORAGE_*), which
    ``options`` (obstore's configuration keys, such as ``endpoint``, ``access_key_id``,
    ``region``, ``client_options``) override. Its own retries are off: ``_object`` retries,
    counting attempts and resuming short bodies.
    """

    CHUNK = 1 << 20  # a body arrives in chunks of at least this many bytes (the last excepted)

    def __init__(
        self, kind: str, scheme: str, container: str, options: dict, retry: dict | None = None
    ) -> None:
        import obstore
        from obstore import exceptions
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        self._obstore = obstore
        self._exc = exceptions
        self.kind = kind
        options = emulator_options(kind, options)
        client = {"timeout": "60s", "connect_timeout": "10s"}
        # Client options given at all replace those obstore reads from the environment: the
        # store's own ALLOW_HTTP variable is read here.
        if scheme == "http" or options.pop(_ALLOW_HTTP, False):
            client["allow_http"] = True
        elif any(_truthy(os.environ.get(name)) for name in ALLOW_HTTP_ENV.get(kind, ())):
            client["allow_http"] = True
        client.update(options.pop("client_options", None) or {})
        retry = retry or {"max_retries": 0}  # writers retry each request (``_upload``)
        if kind == "s3":
            self.store = S3Store(container, client_options=client, retry_config=retry, **options)
        elif kind == "gcs":
            self.store = GCSStore(container, client_options=client, retry_config=retry, **options)
        elif kind == "azure":
            self.store = AzureStore(container, client_options=client, retry_config=retry, **options)
        else:
            self.store = HTTPStore.from_url(
                f"{scheme}://{container}", client_options=client, retry_config=retry, **options
            )

    def get(self, key: str, start, end, if_match) -> Response:
        opts = {}
        if start is not None:
            opts["range"] = (start, end)
        if if_match is not None:
            opts["if_match"] = if_match
        try:
            result = self._obstore.get(self.store, key, options=opts or None)
            meta = result.meta
            stream = result.stream(min_chunk_size=self.CHUNK)
        except Exception as exc:
            raise self._sort(exc) from exc
        return Response(int(meta["size"]), meta.get("e_tag"), self._chunks(stream))

    def _chunks(self, stream):
        try:
            yield from stream
        except Exception as exc:
            raise self._sort(exc) from exc

    def _sort(self, exc: Exception) -> Exception:
        """``exc`` as one of the failure kinds above."""
        exc_types = self._exc
        text = str(exc)
        match = _CODE.search(text)
        code = match.group(1) if match else None
        detail = _shorten(text)
        if isinstance(exc, FileNotFoundError):
            return NotFound(detail, code)
        if isinstance(exc, exc_types.PreconditionError):
            return Changed("If-Match failed: 412 Precondition Failed", code)
        if isinstance(exc, (exc_types.PermissionDeniedError, exc_types.UnauthenticatedError)):
            return Denied(detail, code)
        if isinstance(exc, (exc_types.UnknownConfigurationKeyError, exc_types.InvalidPathError)):
            return Fatal(detail, code)
        status = _STATUS.search(text)
        if status is not None:
            value = int(status.group(1))
            if value == 416:
                return Changed(detail, code)
            if value in (401, 403):
                return Denied(detail, code)
            if value == 404:
                return NotFound(detail, code)
            if value >= 500 or value in (408, 429):
                return Transient(detail, code)
            return Fatal(detail, code)
        if isinstance(exc, (TypeError, ValueError)) or "builder error" in text:
            if "builder error" in text and text.count("http://"):
                names = "=true or ".join(ALLOW_HTTP_ENV.get(self.kind, ()))
                detail = "the request could not be made (a plain-http endpoint needs "
                detail += f"{names}=true or client_options allow_http): {_shorten(text)}"
            return Fatal(detail, code)
        # No status: the connection failed, timed out or the body was cut short.
        return Transient(detail, code)


# The variables that let a store's client speak plain HTTP (to an emulator on 127.0.0.1).
ALLOW_HTTP_ENV = {
    "s3": ("AWS_ALLOW_HTTP",),
    "gcs": ("GOOGLE_ALLOW_HTTP",),
    "azure": ("AZURE_ALLOW_HTTP", "AZURE_STORAGE_ALLOW_HTTP"),
}
# Azure's storage emulators (Azurite) accept this development account; its key is public.
AZURE_EMULATOR_ACCOUNT = "devstoreaccount1"
AZURE_EMULATOR_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_ALLOW_HTTP = "__allow_http"  # set by emulator_options: the endpoint it chose is plain HTTP
_S3_ENDPOINT_KEYS = ("endpoint", "endpoint_url", "aws_endpoint", "aws_endpoint_url")
_GOOGLE_CREDENTIALS = (
    "service_account",
    "service_account_path",
    "service_account_key",
    "application_credentials",
    "bearer_token",
)


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _given(options: dict, name: str, prefix: str) -> bool:
    return options.get(name) is not None or options.get(prefix + name) is not None


def emulator_options(kind: str, options: dict) -> dict:
    """``options`` (obstore's configuration keys) with what pointing a store at a local
    emulator needs and obstore would not do by itself:

    - gs://: ``STORAGE_EMULATOR_HOST`` (the variable Google's own clients and gcsfs read),
      when no ``base_url`` is given, becomes the ``base_url``; without credentials a dummy
      ``bearer_token`` is sent (an emulator checks none; obstore would otherwise ask the
      cloud's metadata server for a token).
    - az://: ``use_emulator`` (or AZURE_STORAGE_USE_EMULATOR) with an ``endpoint``: obstore
      alone ignores the endpoint then (it reads AZURITE_BLOB_STORAGE_URL, default
      http://127.0.0.1:10000), so the emulator's development account is used at that
      endpoint instead.

    Either turns plain HTTP on when the endpoint is ``http://``, as does an ``http://`` S3
    endpoint (``endpoint`` in ``options``, or AWS_ENDPOINT_URL): an endpoint written with
    that scheme asks for plain HTTP already, so AWS_ALLOW_HTTP is not needed on top. Keys are
    matched in any case, as obstore matches them (and handed on lowercased, so that an added
    key never duplicates one the user spelled in capitals).
    """
    options = dict(options)
    if kind == "s3":
        given = {str(key).lower(): value for key, value in options.items()}
        endpoint = next(
            (given[k] for k in _S3_ENDPOINT_KEYS if given.get(k)),
            os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT"),
        )
        if str(endpoint or "").lower().startswith("http://"):
            options[_ALLOW_HTTP] = True
    if kind in ("gcs", "azure"):
        options = {str(key).lower(): value for key, value in options.items()}
    if kind == "gcs":
        host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
        if (
            host
            and not _given(options, "base_url", "google_")
            and not os.environ.get("GOOGLE_BASE_URL")
        ):
            if "://" not in host:
                host = "http://" + host
            options["base_url"] = host.rstrip("/")
            env = ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_BEARER")
            if not any(_given(options, n, "google_") for n in _GOOGLE_CREDENTIALS) and not any(
                k.startswith(env) for k in os.environ
            ):
                options["bearer_token"] = "emulator"
            options[_ALLOW_HTTP] = host.startswith("http://")
    elif kind == "azure":
        emulator = options.get("use_emulator", options.get("azure_storage_use_emulator"))
        if emulator is None:
            emulator = os.environ.get("AZURE_STORAGE_USE_EMULATOR")
        endpoint = options.get("endpoint") or options.get("azure_storage_endpoint")
        if _truthy(emulator) and endpoint:
            options.pop("azure_storage_use_emulator", None)
            options["use_emulator"] = False  # over AZURE_STORAGE_USE_EMULATOR too
            if not _given(options, "account_name", "azure_storage_"):
                options["account_name"] = AZURE_EMULATOR_ACCOUNT
            if not _given(options, "account_key", "azure_storage_"):
                options["account_key"] = AZURE_EMULATOR_KEY
            options[_ALLOW_HTTP] = str(endpoint).startswith("http://")
    return options


# -- fsspec ---------------------------------------------------------------------------------


class FsspecEngine:
    """Any fsspec filesystem, for the schemes obstore lacks (hf:// among them). Reads exact
    ranges with ``cat_file`` (never a buffered file object: its read-ahead turns a small read
    into a large one). The size and, where the filesystem reports one, the ETag come from
    ``info()`` once per object; they pin it (checked again on every read that reports them).
    """

    def __init__(self, scheme: str, options: dict) -> None:
        try:
            import fsspec
        except ImportError:
            raise ValueError(
                f"{scheme}:// needs fsspec (pip install fsspec and the package for {scheme})"
            ) from None
        try:
            self.fs = fsspec.filesystem(scheme, **options)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"{scheme}:// cannot be read: {exc}") from exc
        self.scheme = scheme
        self._info: dict = {}
        self._lock = threading.Lock()

    def _path(self, container: str, key: str) -> str:
        return f"{self.scheme}://{container}/{key}"

    def info(self, path: str) -> tuple:
        with self._lock:
            known = self._info.get(path)
        if known is None:
            info = self.fs.info(path)
            etag = info.get("ETag") or info.get("etag")
            known = (int(info["size"]), None if etag is None else str(etag))
            with self._lock:
                self._info[path] = known
        return known

    def get(self, path: str, start, end, if_match) -> Response:
        try:
            size, etag = self.info(path)
            if if_match is not None and etag is not None and etag != if_match:
                raise Changed(f"ETag {etag}, pinned {if_match}")
            data = self.fs.cat_file(path, start, end)
        except _Failure:
            raise
        except FileNotFoundError as exc:
            raise NotFound(_shorten(exc)) from exc
        except PermissionError as exc:
            raise Denied(_shorten(exc)) from exc
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise Fatal(_shorten(exc)) from exc
        except Exception as exc:
            raise Transient(_shorten(f"{type(exc).__name__}: {exc}")) from exc
        return Response(size, etag, iter((data,)))


# -- fork-safe fallbacks -----------------------------------------------------------------
#
# obstore's runtime is process-global and does not survive fork: a forked child of a process
# that used it hangs on its first request, even with a store of its own. Such a child (a
# DataLoader worker forked after the dataset was read in the parent) reads through these
# instead: botocore for S3, the standard library for HTTP(S), fsspec for GCS and Azure.


class BotoEngine:
    """S3 through botocore (made in the process that uses it): exact ranges, If-Match."""

    def __init__(self, bucket: str, options: dict) -> None:
        try:
            import botocore.config
            import botocore.session
        except ImportError:
            raise ValueError(
                "a forked process of one that read from S3 needs botocore (pip install boto3): "
                "obstore does not work across fork; or use the spawn or forkserver start method"
            ) from None
        self.bucket = bucket
        pick = _option_picker(options)
        endpoint = pick("endpoint", "aws_endpoint", "endpoint_url", "aws_endpoint_url")
        session = botocore.session.get_session()
        self.client = session.create_client(
            "s3",
            region_name=pick("region", "aws_region", "aws_default_region")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            endpoint_url=endpoint or os.environ.get("AWS_ENDPOINT_URL"),
            aws_access_key_id=pick("access_key_id", "aws_access_key_id"),
            aws_secret_access_key=pick("secret_access_key", "aws_secret_access_key"),
            aws_session_token=pick("session_token", "token", "aws_session_token"),
            config=botocore.config.Config(
                retries={"max_attempts": 1},
                s3={"addressing_style": "path"},
                max_pool_connections=64,
                connect_timeout=10,
                read_timeout=60,
            ),
        )

    def get(self, key: str, start, end, if_match) -> Response:
        from botocore.exceptions import ClientError

        kwargs = {"Bucket": self.bucket, "Key": key}
        if start is not None:
            kwargs["Range"] = f"bytes={start}-{end - 1}"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            answer = self.client.get_object(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            detail = _shorten(f"{status} {code}: {error.get('Message', exc)}")
            if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404:
                raise NotFound(detail, "NoSuchBucket" if code == "NoSuchBucket" else code) from None
            if status == 412 or code == "PreconditionFailed":
                raise Changed("If-Match failed: 412 Precondition Failed", code) from None
            if status == 416:
                raise Changed(detail, code) from None
            if status in (401, 403):
                raise Denied(detail, code) from None
            if status >= 500 or status in (408, 429) or code in ("SlowDown", "Throttling"):
                raise Transient(detail, code) from None
            raise Fatal(detail, code) from None
        except Exception as exc:
            raise Transient(_shorten(f"{type(exc).__name__}: {exc}")) from exc
        size = answer["ContentLength"]
        content_range = answer.get("ContentRange")
        if content_range:
            size = int(content_range.rpartition("/")[2])
        return Response(size, answer.get("ETag"), _body_chunks(answer["Body"]))


def _body_chunks(body, step: int = 1 << 20):
    try:
        while True:
            chunk = body.read(step)
            if not chunk:
                return
            yield chunk
    except Exception as exc:
        raise Transient(_shorten(f"{type(exc).__name__}: {exc}")) from exc
    finally:
        body.close()


def _option_picker(options: dict):
    lowered = {str(k).lower(): v for k, v in options.items()}

    def pick(*names):
        for name in names:
            if lowered.get(name) is not None:
                return lowered[name]
        return None

    return pick


class HttpEngine:
    """HTTP(S) through the standard library: Range and If-Match headers, one connection per
    request (kept simple: this is the fallback of forked children)."""

    def __init__(self, scheme: str, host: str) -> None:
        self.base = f"{scheme}://{host}"

    def get(self, key: str, start, end, if_match) -> Response:
        import urllib.error
        import urllib.request

        headers = {}
        if start is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        if if_match is not None:
            headers["If-Match"] = if_match
        request = urllib.request.Request(f"{self.base}/{key}", headers=headers)
        try:
            answer = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as exc:
            detail = f"{exc.code} {exc.reason}"
            exc.close()
            if exc.code == 404:
                raise NotFound(detail) from None
            if exc.code in (412, 416):
                raise Changed(detail) from None
            if exc.code in (401, 403):
                raise Denied(detail) from None
            if exc.code >= 500 or exc.code in (408, 429):
                raise Transient(detail) from None
            raise Fatal(detail) from None
        except Exception as exc:
            raise Transient(_shorten(f"{type(exc).__name__}: {exc}")) from exc
        length = answer.headers.get("Content-Length")
        content_range = answer.headers.get("Content-Range")
        if content_range:
            size = int(content_range.rpartition("/")[2])
        elif start is not None:
            answer.close()
            raise Fatal("the server ignored the Range header (no 206 answer)")
        else:
            size = int(length) if length is not None else -1
        return Response(size, answer.headers.get("ETag"), _body_chunks(answer))


# -- local files ----------------------------------------------------------------------------


class LocalEngine:
    """Files of the local file system, by ``os.pread``. The "ETag" is the file's identity
    (device, inode, size, modification time), so a file replaced or rewritten is seen."""

    def get(self, path: str, start, end, if_match) -> Response:
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError as exc:
            raise NotFound(_shorten(exc)) from exc
        except PermissionError as exc:
            raise Denied(_shorten(exc)) from exc
        except OSError as exc:
            raise Fatal(_shorten(exc)) from exc
        try:
            st = os.fstat(fd)
            etag = f"{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"
            if if_match is not None and etag != if_match:
                raise Changed(f"the file changed (now {etag}, pinned {if_match})")
            begin = 0 if start is None else start
            stop = st.st_size if end is None else min(end, st.st_size)
            if start is not None and begin >= st.st_size:
                raise Changed(f"range {start}..{end} past the end of {st.st_size} bytes")
            parts = []
            while begin < stop:
                part = os.pread(fd, stop - begin, begin)
                if not part:
                    break
                parts.append(part)
                begin += len(part)
        except OSError as exc:
            raise Transient(_shorten(exc)) from exc
        finally:
            os.close(fd)
        return Response(st.st_size, etag, iter(parts))


# -- which engine ---------------------------------------------------------------------------

_engines: dict = {}
_engines_lock = threading.Lock()
# Whether this process, or one it was forked from, started obstore's runtime.
_obstore_started = False
_obstore_pid = None


def _after_fork_in_child() -> None:
    # The parent's clients (their runtimes, pools and event loops) are not usable here.
    global _engines_lock
    _engines.clear()
    _engines_lock = threading.Lock()


def obstore_usable() -> bool:
    """Whether obstore works in this process: not in a fork of a process that started it."""
    return not _obstore_started or _obstore_pid == os.getpid()


after_fork_in_child(_after_fork_in_child)


_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_", "STORAGE_EMULATOR_HOST")


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def engine_for(scheme: str, container: str, options: dict, small: bool = False):
    """``(engine, key prefix style)``: the engine of this process for ``scheme://container``
    with ``options`` (made now if needed). ``style`` is "key" when the engine is given object
    keys under the container, "url" when it is given whole URLs (fsspec), "path" for local
    files."""
    from ._url import OBSTORE_SCHEMES

    if scheme == "file":
        return LocalEngine(), "path"
    kind = OBSTORE_SCHEMES.get(scheme)
    # The environment is part of the key: an engine reads its settings from it when made.
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
    # Small whole objects (metadata) in a process that has not started obstore's runtime go
    # through the fork-safe engine: opening a dataset in a DataLoader's parent must not start
    # the runtime, or the workers it forks could not use obstore. Only for S3 and HTTP(S),
    # whose fallbacks read the same settings as obstore: gcsfs and adlfs name theirs
    # otherwise (they would ignore an emulator's base_url or a service account key given).
    fallback = kind is not None and (
        not obstore_usable() or (small and not _obstore_started and kind in ("s3", "http"))
    )
    key = (scheme, container if kind is not None else None, _freeze(options), env, fallback)
    with _engines_lock:
        engine = _engines.get(key)
    if engine is None:
        if fallback:
            try:
                engine = _fallback(kind, scheme, container, options)
            except ValueError as exc:
                if not obstore_usable():
                    from .._errors import StorageError

                    url = f"{scheme}://{container}"
                    raise StorageError(
                        f"{url}: cannot be read in this process: it was forked from one that "
                        "used obstore, whose runtime does not survive fork, and the fork-safe "
                        f"fallback is not available ({exc}). Start DataLoader workers with "
                        "multiprocessing_context='spawn' or 'forkserver'",
                        url,
                    ) from exc
                # Its package is missing: obstore reads the metadata too (this process's
                # forked children then use the fallback, and need that package).
        if engine is None and kind is not None:
            _mark_obstore_started()
            try:
                engine = ObstoreEngine(kind, scheme, container, options)
            except ImportError:
                raise ValueError(
                    f"{scheme}:// needs obstore: pip install 'atlas-fast[remote]'"
                ) from None
            except Exception as exc:
                raise ValueError(f"{scheme}://{container}: bad storage options: {exc}") from exc
        elif engine is None:
            engine = FsspecEngine(scheme, options)
        with _engines_lock:
            engine = _engines.setdefault(key, engine)
    return engine, ("url" if isinstance(engine, FsspecEngine) else "key")


def check_location(url: str, scheme: str, container: str, options: dict) -> None:
    """Refuse, naming ``url``, a scheme no engine reads and a ``storage_options`` key the
    engine does not know (``InvalidArgumentError``), when the dataset is opened rather than
    at its first read. obstore's keys are checked by building a store, which starts nothing
    (its runtime starts with the first request), so this is safe before a fork."""
    from .._errors import InvalidArgumentError
    from ._url import OBSTORE_SCHEMES

    if scheme == "file":
        return
    kind = OBSTORE_SCHEMES.get(scheme)
    if kind is None:
        try:
            from fsspec.registry import known_implementations, registry
        except ImportError:
            known, more = False, " (other schemes are read through fsspec: pip install fsspec)"
        else:
            known, more = (
                scheme in known_implementations or scheme in registry,
                ", or a scheme fsspec knows",
            )
        if not known:
            raise InvalidArgumentError(
                f"{url}: unknown URL scheme {scheme}://: atlas_fast reads s3://, gs://, az://, "
                f"http(s)://, file://{more}"
            )
        return
    try:
        from obstore import exceptions
    except ImportError:
        return  # reading says which extra to install
    try:
        ObstoreEngine(kind, scheme, container, options)
    except exceptions.UnknownConfigurationKeyError as exc:
        match = _UNKNOWN_KEY.search(str(exc))
        key = match.group(1) if match else "?"
        raise InvalidArgumentError(
            f"{url}: storage_options[{key!r}] is not a setting of {scheme}:// (obstore's "
            f"configuration keys, or the reading settings {', '.join(ENGINE_KEYS)})"
        ) from None
    except Exception:
        return  # reported, with its context, when the engine is made to read


_UNKNOWN_KEY = re.compile(r"key: '([^']*)' is not valid")


def _mark_obstore_started() -> None:
    global _obstore_started, _obstore_pid
    _obstore_started, _obstore_pid = True, os.getpid()


def _fallback(kind: str, scheme: str, container: str, options: dict):
    """The engine of a forked child of a process that used obstore (see above)."""
    if kind == "s3":
        return BotoEngine(container, options)
    if kind == "http":
        return HttpEngine(scheme, container)
    return FsspecEngine({"gcs": "gcs", "azure": "abfs"}[kind], options)
