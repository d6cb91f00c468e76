"""The two cores: each reads blocks (index lookup, decompression, unpickling, the block cache).

The compiled modules are built from the checkout's ``src/``: ``src/_reader.pyx`` (with its
units ``_zstd.pxi``, ``_mapping.pxi``, ``_cache.pxi``, ``_readahead.pxi``) builds ``_reader``,
whose pure-Python twin ``_reader_py.py`` implements the same contract,
``atlas_fast._contract``; ``atlas_fast._backend`` picks one at import. The writer's block
compressor is ``_compress`` (``src/_compress.pyx``) / ``_compress_py``; the pickle scanner of
partial decoding is ``_pickle_scan`` (``src/_pickle_scan.pyx``, its C API in
``src/atlas_fast._core._pickle_scan.pxd``, the dotted name Cython finds it by; the Python
core unpickles whole blocks instead). Both cores share ``_shards`` (opening a shard's files),
``_pool`` (the decompression pool: batches and read-ahead) and ``_objsize`` (what a decoded
block costs in the cache). Nothing here imports the facade.
"""
