"""Amazon-670K with dense softmax: SLIDE's baseline in the same harness (see configs/slide_amazon.py)."""

from configs.slide_amazon import slide_config


def get_config():
    c = slide_config("amazon670k", "dense")
    # The dense step's temporaries are whole [670,091, 128] arrays (343 MB each). Kept in one glibc arena
    # they fragment it: in two of five benchmark runs the dense step took 6.3 s and 10.2 s instead of
    # 1.1-1.2 s, at 6.2 GB, and a 300-step run peaked at 6.9 GB (docs/benchmarks.md). With glibc's default
    # (off) it stayed at 3.2 GB in every run (1.8 s per step in the last two benchmark runs).
    c.numerics.keep_freed_memory = False
    return c
