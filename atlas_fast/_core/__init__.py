"""The two cores: each reads blocks (index lookup, decompression, unpickling, the block cache).

``_reader.pyx`` (compiled, with its units ``_zstd.pxi``, ``_mapping.pxi``, ``_cache.pxi``,
``_readahead.pxi``) and its pure-Python twin ``_reader_py.py`` implement the same contract,
``atlas_fast._contract``; ``atlas_fast._backend`` picks one at import. The writer's block
compressor is ``_compress`` / ``_compress_py``; the pickle scanner of partial decoding is
``_pickle_scan.pyx`` (its C API in ``_pickle_scan.pxd``). Both cores share ``_shards`` (opening
a shard's files), ``_pool`` (the decompression pool: batches and read-ahead) and ``_objsize``
(what a decoded block costs in the cache). Nothing here imports the facade.
"""
