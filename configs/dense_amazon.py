"""Amazon-670K with dense softmax: SLIDE's baseline in the same harness (see configs/slide_amazon.py)."""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("amazon670k", "dense")
    # The dense step's temporaries are whole [670,091, 128] arrays (343 MB each). Kept in one glibc arena
    # they fragment it: some benchmark runs had several times slower steps at about twice the memory. With
    # glibc's default (off) the peak was the same in every run (docs/benchmarks.md, "bf16, ISA cap, huge
    # pages, freed-memory reuse").
    c.numerics.keep_freed_memory = False
    return c
