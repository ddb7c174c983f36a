"""SLIDE on Amazon-670K: the LSH-sparse output layer (MLSys 2020/2021). hwrepro's main job.

    python launch.py --config=configs/slide_amazon.py
    python launch.py --config=configs/slide_amazon.py --config.data.dir=/data/xc   # holds Amazon-670K/train.txt

Without the real files under data.dir, it trains on a synthetic stand-in with Amazon-670K's shape (135,909
features, 670,091 labels, 490,449 train / 153,025 test points, ~75 features and ~5.4 labels per point,
power-law label frequencies); the log and run.json say so.

Defaults from SLIDE's public code (SLIDE/Config_amz.csv, Config.h) unless a comment says otherwise.
"""

import ml_collections

from hwrepro.harness.config import base_config


def slide_config(dataset: str, method: str) -> ml_collections.ConfigDict:
    """The SLIDE family's shared fields; slide_*, dense_* and sampled_* configs differ only where they say."""
    c = base_config("slide")
    c.name = f"{method}_{dataset}"
    c.data.dataset = dataset          # amazon670k | wikilsh325k | tiny | text8
    c.data.seed = 0                   # synthetic stand-in's seed (data stays fixed across training seeds)
    c.data.num_train = 0              # synthetic only: 0 = the real data set's size (text8: tokens)
    c.data.num_test = 0
    c.data.max_features = 128         # fixed width; longer points keep their largest values (counted in run.json)
    c.data.max_labels = 32
    c.data.window = 5                 # text8 only: skip-gram window
    c.data.min_count = 5              # text8 only: rarer words are dropped (word2vec.c's default)
    c.data.subsample = 1e-3           # text8 only: frequent-word subsampling threshold

    c.model = ml_collections.ConfigDict()
    c.model.method = method           # lsh | sampled | dense
    c.model.hidden = 128              # SLIDE's Amazon-670K hidden layer
    # Active output neurons per batch. SLIDE: sparsity 0.005, ~3,350 per example, chosen per example; here one
    # batch-shared set (an XLA-friendly gather + matmul), 8,192 rows per batch of 128. Fewer rows gave both
    # SLIDE and sampled softmax a higher one-epoch P@1 but left SLIDE's tables little to choose (the sweep in
    # docs/benchmarks.md, "Candidate-set size"); 8,192 stays, chosen before that sweep.
    c.model.candidate_mode = "shared"  # shared | per_example (SLIDE's own)
    c.model.num_candidates = 8192
    c.model.bucket_capacity = 16      # ids read per hit bucket; SLIDE's bucket size, 128, did no better in one
                                      # epoch with DWTA tables (docs/benchmarks.md, "Candidate-set size")
    c.model.min_count = 2             # SLIDE's "sampling" mode threshold: ids retrieved at least twice
    c.model.sampler = "uniform"       # random fill / sampled-softmax negatives: uniform | log_uniform

    c.lsh = ml_collections.ConfigDict()
    # SLIDE's Amazon-670K tables are DWTA, K = 6, L = 50 (--config.lsh.kind=dwta --config.lsh.num_hashes=6
    # --config.lsh.num_tables=50). Here SimHash, K = 16 bits, L = 25: DWTA's negatives were hardly harder than
    # uniform ones and SLIDE ended its epoch level with sampled softmax; with SimHash it is ahead in P@1. L = 50
    # finds harder negatives still but doubles the rebuilds. Measured at Amazon-670K's shape ("Which hash" in
    # docs/benchmarks.md).
    # simhash_pairs (tables from pairs of 8 half-codes: a sixth of the hashing) lost ~0.01 P@1 in one epoch
    # (docs/slide_costs.md, "Table upkeep").
    c.lsh.kind = "simhash"            # a hash family of hwrepro/sparse/hashes/: simhash | simhash_pairs | dwta | yours
    c.lsh.num_hashes = 16             # K: simhash bits per table (2^16 buckets); dwta hashes of log2(bin_size) bits
    c.lsh.num_tables = 25             # L
    # Each family's own options, in a group named after it (the one of lsh.kind is used):
    # density: Gaussian planes (1.0); SLIDE's sparse "ratio 3" ~1/3. dtype: what rows and planes are rounded to
    # for the projection (f32 sums): bf16 hashes 1.3-2.2x faster than fp32 on an AVX512-BF16 CPU and flips 0.07%
    # of the bits; with it (and 5ee5549's grouping) one epoch's P@1 held over 2 seeds (docs/slide_costs.md,
    # "SLIDE's own costs, in one run"). On an AVX2 CPU bf16 hashes 1.3-1.7x slower, so "auto" picks bf16 only
    # where bf16 products are native (run.json: lsh_hash_dtype). The eval.lsh inference tables take these too.
    c.lsh.simhash = ml_collections.ConfigDict(dict(density=1.0, dtype="auto"))
    c.lsh.simhash_pairs = ml_collections.ConfigDict(dict(density=1.0, dtype="auto"))
    c.lsh.dwta = ml_collections.ConfigDict(dict(bin_size=8))      # SLIDE's bin size (6 hashes x 3 bits = RangePow 18)
    c.lsh.rebuild_period = 50         # SLIDE's Amazon config rehashes tables every 50 batches (0: only at redraws)...
    c.lsh.rebuild_decay = 0.01        # ...with the period growing as training settles (exp(decay * i))
    c.lsh.redraw_period = 1000        # ...and draws new hash functions every 1,000 batches
    c.lsh.redraw_decay = 0.0
    # How the tables follow W between those rebuilds: "rebuild" keeps every id, sorted by bucket, and changes
    # nothing in between (stale rows stay where they were; each rebuild re-hashes only the rows changed since
    # the last and regroups every table, hwrepro.sparse.lsh.rebuild); "incremental" keeps buckets of
    # model.bucket_capacity ids (SLIDE's fixed bucket size, reservoir replacement when full) and every
    # lsh.update_every steps re-hashes only the rows the steps changed and moves them (hwrepro.sparse.lsh.refile).
    # Rebuilds and redraws stay on the schedule above in both. Staleness against cost: docs/slide_costs.md,
    # "Incremental tables".
    c.lsh.maintenance = "rebuild"     # rebuild | incremental
    c.lsh.update_every = 1            # incremental only: steps between two refiles

    c.train.batch_size = 128          # SLIDE's code; its paper used 256 for Amazon-670K
    # SLIDE: Adam, lr 1e-4, beta1 0.9, beta2 0.999, eps 1e-8, over 10 epochs. For the one-epoch comparison
    # 1e-3: 1e-4 learnt far less in the first 1,000 steps (docs/benchmarks.md, "One epoch of each method").
    c.train.learning_rate = 1e-3
    # Adam's eps, every method (SLIDE's: 1e-8; beta1 0.9, beta2 0.999 fixed). One epoch at lr 3e-3, eps 1e-6
    # gave SLIDE P@1 0.222 and sampled softmax 0.213 against 0.169 / 0.162 with these (one seed, 20,000 test
    # points); lr 1e-2, eps 1e-5 made dense softmax learn (docs/slide_costs.md, "A fair dense ceiling").
    c.train.adam_eps = 1e-8
    # Storage of the row-sparse Adam moments of E and W (methods lsh, sampled): fp32 | bf16 (half their
    # bytes and row traffic; its P@1 effect: docs/slide_costs.md, "Narrower Adam moments").
    c.train.moments_dtype = "fp32"
    c.train.num_epochs = 1            # SLIDE ran 10; one epoch is the time-to-accuracy comparison here
    c.train.log_every = 100
    c.train.eval_every = 1000
    # The whole training state (1.3 GB at Amazon-670K's size) about twice an epoch, so a killed or preempted
    # run resumes from there; the interval is sized by its measured cost (docs/benchmarks.md, "Checkpoints").
    c.train.checkpoint_every = 2000

    c.eval = ml_collections.ConfigDict()
    c.eval.subset = 2048              # fixed shuffled test subset during training (not SLIDE's first lines)
    c.eval.batch_size = 256
    c.eval.final_points = 0           # final P@k on: 0 = the whole test split, else a fixed shuffled subset
    # LSH-scored prediction in the final evaluation (final.json: test_lsh_P@k; test_lsh_share_scored, the mean
    # share of all labels scored per point; test_lsh_seconds against test_seconds, dense). "inference": tables
    # built once after training over (w, b) for inner products (simple-LSH: the largest logits are the nearest
    # rows; hwrepro.sparse.evaluation.inference_tables) with the family, K and L below (family options from
    # lsh.<kind>); "training": the training tables as they are (hashes of w alone: they missed most of the
    # dense top-1 labels). probe_bits m: multi-probe, 2^m buckets per table (the m least certain hashes
    # changed); bucket_capacity: ids read per probed bucket; max_scored: at most this many distinct labels
    # scored per point, the most often retrieved (exactly). Precision, share scored and time of the choices:
    # docs/slide_costs.md, "LSH-scored prediction".
    c.eval.lsh = ml_collections.ConfigDict(dict(tables="inference", kind="simhash", num_hashes=8, num_tables=50,
                                                probe_bits=2, bucket_capacity=16, max_scored=512))
    return c


def get_config():
    return slide_config("amazon670k", "lsh")
