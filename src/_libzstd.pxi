# Included by _reader.pyx and _compress.pyx (each extension binds libzstd for itself, from the
# same library): libzstd's functions, bound at import with dlopen/dlsym.
# Directives are set once, in setup.py.
#
# The including module defines BACKEND and imports os and sys.

from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlerror, dlopen, dlsym

from zstd cimport (
    ZSTD_CCtx_loadDictionary_fn,
    ZSTD_CCtx_reset_fn,
    ZSTD_CCtx_setParameter_fn,
    ZSTD_CCtx_setPledgedSrcSize_fn,
    ZSTD_DCtx_refDDict_fn,
    ZSTD_DCtx_reset_fn,
    ZSTD_compressBound_fn,
    ZSTD_compressStream2_fn,
    ZSTD_createCCtx_fn,
    ZSTD_createDCtx_fn,
    ZSTD_createDDict_fn,
    ZSTD_decompressStream_fn,
    ZSTD_freeCCtx_fn,
    ZSTD_freeDCtx_fn,
    ZSTD_freeDDict_fn,
    ZSTD_getDictID_fromDDict_fn,
    ZSTD_getDictID_fromFrame_fn,
    ZSTD_getErrorName_fn,
    ZSTD_getFrameContentSize_fn,
    ZSTD_isError_fn,
    ZSTD_versionNumber_fn,
    ZSTD_versionString_fn,
)


cdef extern from "<dlfcn.h>" nogil:
    ctypedef struct Dl_info:
        const char* dli_fname
    int dladdr(const void* addr, Dl_info* info)


cdef ZSTD_versionNumber_fn ZSTD_versionNumber = NULL
cdef ZSTD_versionString_fn ZSTD_versionString = NULL
cdef ZSTD_isError_fn ZSTD_isError = NULL
cdef ZSTD_getErrorName_fn ZSTD_getErrorName = NULL
cdef ZSTD_getFrameContentSize_fn ZSTD_getFrameContentSize = NULL
cdef ZSTD_createDCtx_fn ZSTD_createDCtx = NULL
cdef ZSTD_freeDCtx_fn ZSTD_freeDCtx = NULL
cdef ZSTD_DCtx_reset_fn ZSTD_DCtx_reset = NULL
cdef ZSTD_DCtx_refDDict_fn ZSTD_DCtx_refDDict = NULL
cdef ZSTD_createDDict_fn ZSTD_createDDict = NULL
cdef ZSTD_freeDDict_fn ZSTD_freeDDict = NULL
cdef ZSTD_getDictID_fromDDict_fn ZSTD_getDictID_fromDDict = NULL
cdef ZSTD_getDictID_fromFrame_fn ZSTD_getDictID_fromFrame = NULL
cdef ZSTD_decompressStream_fn ZSTD_decompressStream = NULL

# Compression, bound when the library has it (the reader does not need it).
cdef ZSTD_createCCtx_fn ZSTD_createCCtx = NULL
cdef ZSTD_freeCCtx_fn ZSTD_freeCCtx = NULL
cdef ZSTD_CCtx_setParameter_fn ZSTD_CCtx_setParameter = NULL
cdef ZSTD_CCtx_reset_fn ZSTD_CCtx_reset = NULL
cdef ZSTD_CCtx_setPledgedSrcSize_fn ZSTD_CCtx_setPledgedSrcSize = NULL
cdef ZSTD_CCtx_loadDictionary_fn ZSTD_CCtx_loadDictionary = NULL
cdef ZSTD_compressStream2_fn ZSTD_compressStream2 = NULL
cdef ZSTD_compressBound_fn ZSTD_compressBound = NULL

cdef bint _zstd_ok = False
cdef bint _zcompress_ok = False
_zstd_info = None  # dict reported by zstd_library() once bound
_zstd_error = "libzstd was not looked for"

_SYMBOLS = (
    "ZSTD_versionNumber", "ZSTD_versionString", "ZSTD_isError", "ZSTD_getErrorName",
    "ZSTD_getFrameContentSize", "ZSTD_createDCtx", "ZSTD_freeDCtx", "ZSTD_DCtx_reset",
    "ZSTD_DCtx_refDDict", "ZSTD_createDDict", "ZSTD_freeDDict", "ZSTD_getDictID_fromDDict",
    "ZSTD_decompressStream", "ZSTD_getDictID_fromFrame",
)
_COMPRESS_SYMBOLS = (
    "ZSTD_createCCtx", "ZSTD_freeCCtx", "ZSTD_CCtx_setParameter", "ZSTD_CCtx_reset",
    "ZSTD_CCtx_setPledgedSrcSize", "ZSTD_CCtx_loadDictionary", "ZSTD_compressStream2",
    "ZSTD_compressBound",
)
_MIN_VERSION = 10400  # ZSTD_DCtx_reset and ZSTD_DCtx_refDDict are stable from 1.4.0


cdef str _dl_error():
    cdef const char* msg = dlerror()
    return "unknown dlopen error" if msg == NULL else msg.decode("utf-8", "replace")


cdef void* _bind_one(void* handle, str name) except NULL:
    cdef bytes cname = name.encode()
    cdef void* sym = dlsym(handle, cname)
    if sym == NULL:
        raise OSError(f"symbol {name} not found")
    return sym


cdef object _bind(str path, object versions=None):
    """Bind every symbol from ``path``; return the library's real path, or raise OSError."""
    global ZSTD_versionNumber, ZSTD_versionString, ZSTD_isError, ZSTD_getErrorName
    global ZSTD_getFrameContentSize, ZSTD_createDCtx, ZSTD_freeDCtx, ZSTD_DCtx_reset
    global ZSTD_DCtx_refDDict, ZSTD_createDDict, ZSTD_freeDDict, ZSTD_getDictID_fromDDict
    global ZSTD_decompressStream, ZSTD_getDictID_fromFrame
    cdef bytes cpath = os.fsencode(path)
    cdef void* handle = dlopen(cpath, RTLD_NOW | RTLD_LOCAL)
    cdef void* syms[14]
    cdef Dl_info info
    cdef unsigned version
    if handle == NULL:
        raise OSError(_dl_error())
    for k, name in enumerate(_SYMBOLS):
        syms[k] = _bind_one(handle, name)
    version = (<ZSTD_versionNumber_fn>syms[0])()
    if version < _MIN_VERSION:
        raise OSError(f"libzstd {version} is older than 1.4.0")
    if versions is not None and version != versions:
        raise OSError(f"libzstd {version} is not python-zstandard's release ({versions})")
    # Handles stay open for the life of the process: the pointers below point into them.
    ZSTD_versionNumber = <ZSTD_versionNumber_fn>syms[0]
    ZSTD_versionString = <ZSTD_versionString_fn>syms[1]
    ZSTD_isError = <ZSTD_isError_fn>syms[2]
    ZSTD_getErrorName = <ZSTD_getErrorName_fn>syms[3]
    ZSTD_getFrameContentSize = <ZSTD_getFrameContentSize_fn>syms[4]
    ZSTD_createDCtx = <ZSTD_createDCtx_fn>syms[5]
    ZSTD_freeDCtx = <ZSTD_freeDCtx_fn>syms[6]
    ZSTD_DCtx_reset = <ZSTD_DCtx_reset_fn>syms[7]
    ZSTD_DCtx_refDDict = <ZSTD_DCtx_refDDict_fn>syms[8]
    ZSTD_createDDict = <ZSTD_createDDict_fn>syms[9]
    ZSTD_freeDDict = <ZSTD_freeDDict_fn>syms[10]
    ZSTD_getDictID_fromDDict = <ZSTD_getDictID_fromDDict_fn>syms[11]
    ZSTD_decompressStream = <ZSTD_decompressStream_fn>syms[12]
    ZSTD_getDictID_fromFrame = <ZSTD_getDictID_fromFrame_fn>syms[13]
    _bind_compression(handle)
    if dladdr(syms[5], &info) and info.dli_fname != NULL:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return os.path.realpath(path) if os.sep in path else path


cdef void _bind_compression(void* handle) noexcept:
    """Bind the compression functions if ``handle`` has them all (else leave them unbound)."""
    global ZSTD_createCCtx, ZSTD_freeCCtx, ZSTD_CCtx_setParameter, ZSTD_CCtx_reset
    global ZSTD_CCtx_setPledgedSrcSize, ZSTD_CCtx_loadDictionary, ZSTD_compressStream2
    global ZSTD_compressBound, _zcompress_ok
    cdef void* syms[8]
    cdef bytes cname
    for k, name in enumerate(_COMPRESS_SYMBOLS):
        cname = name.encode()
        syms[k] = dlsym(handle, cname)
        if syms[k] == NULL:
            _zcompress_ok = False
            return
    ZSTD_createCCtx = <ZSTD_createCCtx_fn>syms[0]
    ZSTD_freeCCtx = <ZSTD_freeCCtx_fn>syms[1]
    ZSTD_CCtx_setParameter = <ZSTD_CCtx_setParameter_fn>syms[2]
    ZSTD_CCtx_reset = <ZSTD_CCtx_reset_fn>syms[3]
    ZSTD_CCtx_setPledgedSrcSize = <ZSTD_CCtx_setPledgedSrcSize_fn>syms[4]
    ZSTD_CCtx_loadDictionary = <ZSTD_CCtx_loadDictionary_fn>syms[5]
    ZSTD_compressStream2 = <ZSTD_compressStream2_fn>syms[6]
    ZSTD_compressBound = <ZSTD_compressBound_fn>syms[7]
    _zcompress_ok = True


def _candidates():
    """Where libzstd is looked for, in order: (path, how it was found, the release it must
    be, or None).

    First the system libzstd, if it is the very release python-zstandard carries: on the
    same machine python-zstandard's _cffi module (the libzstd it exports) decodes 8-9% slower
    per zstd block than the system's, and decoding is most of a compressed miss. Only the
    same release: another one may judge a damaged frame otherwise than the Python backend
    (which decodes with python-zstandard), and both backends must fail alike.
    """
    forced = os.environ.get("ATLAS_FAST_LIBZSTD")
    if forced:
        return [(forced, "ATLAS_FAST_LIBZSTD", None)]
    system = "libzstd.1.dylib" if sys.platform == "darwin" else "libzstd.so.1"
    found = []
    try:
        import zstandard

        same = zstandard.ZSTD_VERSION
        found.append((system, "the system libzstd", same[0] * 10000 + same[1] * 100 + same[2]))
    except (ImportError, AttributeError, TypeError, IndexError):
        pass
    try:
        import importlib.util

        spec = importlib.util.find_spec("zstandard")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if name.startswith("_cffi") and name.endswith((".so", ".dylib")):
                    path = os.path.join(folder, name)
                    found.append((path, "python-zstandard's _cffi module", None))
    found.append((system, "the system libzstd", None))
    return found


def _load_zstd():
    global _zstd_ok, _zstd_info, _zstd_error
    errors = []
    tried_system = False
    for path, how, versions in _candidates():
        try:
            real = _bind(path, versions)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            tried_system = tried_system or how == "the system libzstd"
            continue
        _zstd_ok = True
        _zstd_info = {
            "backend": BACKEND,
            "path": real,
            "version": ZSTD_versionString().decode("ascii", "replace"),
            "version_number": ZSTD_versionNumber(),
            "binding": f"dlopen of {how}",
        }
        return
    if tried_system and not os.environ.get("ATLAS_FAST_LIBZSTD"):
        import ctypes.util

        name = ctypes.util.find_library("zstd")
        if name:
            try:
                real = _bind(name)
            except OSError as exc:
                errors.append(f"{name}: {exc}")
            else:
                _zstd_ok = True
                _zstd_info = {
                    "backend": BACKEND,
                    "path": real,
                    "version": ZSTD_versionString().decode("ascii", "replace"),
                    "version_number": ZSTD_versionNumber(),
                    "binding": "dlopen of the system libzstd (ctypes.util.find_library)",
                }
                return
    _zstd_error = "no usable libzstd: " + "; ".join(errors)


_load_zstd()


def zstd_available():
    """Whether libzstd was bound (otherwise the facade uses the pure-Python backend)."""
    return _zstd_ok


def zstd_load_error():
    """Why libzstd could not be bound, or None."""
    return None if _zstd_ok else _zstd_error


def zstd_library():
    """Which libzstd this backend decompresses with."""
    if not _zstd_ok:
        return {"backend": BACKEND, "path": None, "version": None, "binding": None,
                "error": _zstd_error}
    return dict(_zstd_info)
