"""What a rank reads: datasets (S3 image folders, indexed tar shards, map-style or streamed), the
distributed sampler, which part of the data this process reads, and `make-shards`.

May import `storage`, never `runtime`.
"""
