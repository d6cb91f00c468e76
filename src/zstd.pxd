# The part of libzstd's stable C API (zstd.h, v1.4.0+) that atlas_fast._core._reader calls.
#
# Written from the documented API, not copied from zstd.h: no header is needed to build.
# The functions are not linked: _reader binds pointers of these types with dlsym at import,
# from a libzstd that python-zstandard ships or the system provides.

cdef extern from *:
    """
    /* atlas_fast: opaque libzstd types and constants, declared here (no zstd.h). */
    typedef struct ZSTD_DCtx_s ZSTD_DCtx;
    typedef struct ZSTD_DDict_s ZSTD_DDict;
    typedef struct ZSTD_CCtx_s ZSTD_CCtx;
    typedef struct { const void* src; size_t size; size_t pos; } ZSTD_inBuffer;
    typedef struct { void* dst; size_t size; size_t pos; } ZSTD_outBuffer;
    #define ZSTD_CONTENTSIZE_UNKNOWN (0ULL - 1)
    #define ZSTD_CONTENTSIZE_ERROR (0ULL - 2)
    #define ZSTD_reset_session_only 1
    #define ZSTD_reset_session_and_parameters 3
    #define ZSTD_c_compressionLevel 100
    #define ZSTD_c_contentSizeFlag 200
    #define ZSTD_c_checksumFlag 201
    #define ZSTD_c_dictIDFlag 202
    #define ZSTD_e_end 2
    """
    # Opaque: only pointers to them cross the API.
    ctypedef struct ZSTD_DCtx:
        pass
    ctypedef struct ZSTD_DDict:
        pass
    ctypedef struct ZSTD_CCtx:
        pass

    ctypedef struct ZSTD_inBuffer:
        const void* src
        size_t size
        size_t pos

    ctypedef struct ZSTD_outBuffer:
        void* dst
        size_t size
        size_t pos

    # ZSTD_getFrameContentSize's two special results; ZSTD_DCtx_reset's first mode.
    const unsigned long long ZSTD_CONTENTSIZE_UNKNOWN
    const unsigned long long ZSTD_CONTENTSIZE_ERROR
    const int ZSTD_reset_session_only
    const int ZSTD_reset_session_and_parameters
    # Compression: the parameters python-zstandard's ZstdCompressor sets, ZSTD_e_end.
    const int ZSTD_c_compressionLevel
    const int ZSTD_c_contentSizeFlag
    const int ZSTD_c_checksumFlag
    const int ZSTD_c_dictIDFlag
    const int ZSTD_e_end

ctypedef unsigned (*ZSTD_versionNumber_fn)() noexcept nogil
ctypedef const char* (*ZSTD_versionString_fn)() noexcept nogil
ctypedef unsigned (*ZSTD_isError_fn)(size_t code) noexcept nogil
ctypedef const char* (*ZSTD_getErrorName_fn)(size_t code) noexcept nogil
ctypedef unsigned long long (*ZSTD_getFrameContentSize_fn)(
    const void* src, size_t srcSize) noexcept nogil
ctypedef ZSTD_DCtx* (*ZSTD_createDCtx_fn)() noexcept nogil
ctypedef size_t (*ZSTD_freeDCtx_fn)(ZSTD_DCtx* dctx) noexcept nogil
ctypedef size_t (*ZSTD_DCtx_reset_fn)(ZSTD_DCtx* dctx, int reset) noexcept nogil
ctypedef size_t (*ZSTD_DCtx_refDDict_fn)(ZSTD_DCtx* dctx, const ZSTD_DDict* ddict) noexcept nogil
ctypedef ZSTD_DDict* (*ZSTD_createDDict_fn)(const void* dictBuffer, size_t dictSize) noexcept nogil
ctypedef size_t (*ZSTD_freeDDict_fn)(ZSTD_DDict* ddict) noexcept nogil
ctypedef unsigned (*ZSTD_getDictID_fromDDict_fn)(const ZSTD_DDict* ddict) noexcept nogil
ctypedef unsigned (*ZSTD_getDictID_fromFrame_fn)(const void* src, size_t srcSize) noexcept nogil
ctypedef size_t (*ZSTD_decompressStream_fn)(
    ZSTD_DCtx* zds, ZSTD_outBuffer* output, ZSTD_inBuffer* input) noexcept nogil

# Compression (atlas_fast._core._reader.BlockCompressor); bound only when all are present.
ctypedef ZSTD_CCtx* (*ZSTD_createCCtx_fn)() noexcept nogil
ctypedef size_t (*ZSTD_freeCCtx_fn)(ZSTD_CCtx* cctx) noexcept nogil
ctypedef size_t (*ZSTD_CCtx_setParameter_fn)(ZSTD_CCtx* cctx, int param, int value) noexcept nogil
ctypedef size_t (*ZSTD_CCtx_reset_fn)(ZSTD_CCtx* cctx, int reset) noexcept nogil
ctypedef size_t (*ZSTD_CCtx_setPledgedSrcSize_fn)(
    ZSTD_CCtx* cctx, unsigned long long pledgedSrcSize) noexcept nogil
ctypedef size_t (*ZSTD_CCtx_loadDictionary_fn)(
    ZSTD_CCtx* cctx, const void* dict, size_t dictSize) noexcept nogil
ctypedef size_t (*ZSTD_compressStream2_fn)(
    ZSTD_CCtx* cctx, ZSTD_outBuffer* output, ZSTD_inBuffer* input, int endOp) noexcept nogil
ctypedef size_t (*ZSTD_compressBound_fn)(size_t srcSize) noexcept nogil
