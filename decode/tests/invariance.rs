//! The exactness contract's point 4: the logits are the same bits whatever the I/O backend,
//! queue depth, ring size, RAM cache size (none, partial, all resident), thread count,
//! instruction-set path (vs the scalar reference) and prompt batching: on a fixture of every
//! decoded family (the KV caches, and Qwen3.5's convolution and DeltaNet states, carried exactly
//! across batches and calls).

mod common;

use tarfa_decode::{DecoderOptions, ExpertMode, ExpertOptions, Isa};
use tarfa_runtime::{probe_io_uring, BackendChoice, BackendKind, SourceOptions};

/// One fixture per family, each with its own features (see fixtures/hf/make_fixtures.py).
const NAMES: &[&str] = &[
    "qwen3_moe_b",
    "mixtral",
    "glm4_moe_b",
    "qwen3_5_moe_text",
    "qwen3_next",
    "mimo_v2_flash",
    "deepseek_v3",
    "deepseek_v3_b",
    "glm5_next",
    "glm5_next_b",
];

/// The backends to test here (not in `common`, which cuda-emu's tests share without
/// `tarfa-testtools`). io_uring only where this process can use it; where it cannot, the
/// io_uring part is skipped, saying so, or fails where tools are required (`tarfa_testtools`:
/// `TARFA_REQUIRE_IO_URING`, `TARFA_REQUIRE_TOOLS` or `CI`).
fn backends() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Pread, BackendKind::Mmap];
    if tarfa_testtools::available(tarfa_testtools::Tool::IoUring, probe_io_uring()).is_some() {
        v.insert(0, BackendKind::IoUring);
    }
    v
}

fn opts(
    backend: BackendKind,
    isa: Isa,
    threads: usize,
    batch: bool,
    experts: ExpertOptions,
    qd: u32,
    slots: u32,
) -> DecoderOptions {
    DecoderOptions {
        threads,
        isa: Some(isa),
        experts,
        source: SourceOptions {
            backend: BackendChoice::Only(backend),
            queue_depth: qd,
            slots,
            ..SourceOptions::default()
        },
        batch_prompt: batch,
        prompt_chunk: 0,
        device: Default::default(),
    }
}

fn stream(cache_bytes: u64) -> ExpertOptions {
    ExpertOptions {
        mode: ExpertMode::Stream,
        cache_bytes,
    }
}

/// Every reference prompt, 12 greedy steps each: (tokens, logits bits) per prompt.
fn run(name: &'static str, o: &DecoderOptions) -> Vec<(Vec<u32>, Vec<Vec<u32>>)> {
    let dir = common::model(name);
    let mut dec = common::open(&dir, o);
    common::reference(name)
        .iter()
        .map(|p| {
            let (t, rows) = common::greedy(&mut dec, &p.prompt_ids, 12);
            (t, common::bits(&rows))
        })
        .collect()
}

#[test]
fn logits_bits_do_not_depend_on_backend_isa_threads_batching_or_cache() {
    for &name in NAMES {
        backend_isa_threads_batching_cache(name);
    }
}

/// The fixtures' products are under the kernels' serial threshold: thread counts here change
/// where the non-product work runs, never who computes a product's rows (which
/// `thread_counts_that_really_split_the_products_change_no_bit` proves on a model that splits).
fn backend_isa_threads_batching_cache(name: &'static str) {
    let base = run(
        name,
        &opts(BackendKind::Pread, Isa::Scalar, 1, false, stream(0), 1, 0),
    );
    let expert_bytes = {
        let d = common::open(&common::model(name), &DecoderOptions::default());
        d.experts().total_bytes()
    };
    let caches = [
        stream(0),
        stream(expert_bytes / 3), // partial: evictions happen
        ExpertOptions {
            mode: ExpertMode::Resident,
            cache_bytes: 0,
        },
    ];
    let mut runs = 0;
    for backend in backends() {
        for &isa in &Isa::available_all() {
            for threads in [1, 2, 3] {
                for batch in [false, true] {
                    for c in &caches {
                        let o = opts(backend, isa, threads, batch, c.clone(), 64, 0);
                        assert_eq!(run(name, &o), base, "{name}: {o:?}");
                        runs += 1;
                    }
                }
            }
        }
    }
    eprintln!("{name}: {runs} configurations, each bit-identical to the scalar reference");
}

#[test]
fn logits_bits_do_not_depend_on_queue_depth_or_ring_size() {
    for &name in NAMES {
        queue_depth_ring(name);
    }
}

fn queue_depth_ring(name: &'static str) {
    let base = run(
        name,
        &opts(BackendKind::Pread, Isa::Scalar, 1, false, stream(0), 1, 0),
    );
    for backend in backends() {
        for (qd, slots) in [(1, 1), (1, 2), (4, 5), (32, 0), (256, 0), (64, 7)] {
            let o = opts(backend, Isa::best(), 2, true, stream(0), qd, slots);
            assert_eq!(run(name, &o), base, "{name}: {o:?}");
        }
    }
}

#[test]
fn a_batched_prompt_gives_each_position_the_bits_of_token_by_token_decode() {
    for &name in NAMES {
        batched_prompt(name);
    }
}

fn batched_prompt(name: &'static str) {
    let dir = common::model(name);
    let prompt = &common::reference(name)[0].prompt_ids;
    let mut all = Vec::new();
    for batch in [true, false] {
        let mut dec = common::open(
            &dir,
            &opts(BackendKind::Pread, Isa::best(), 2, batch, stream(0), 64, 0),
        );
        let rows = dec.feed(prompt, true).expect("feed");
        assert_eq!(rows.len(), prompt.len());
        all.push(common::bits(&rows));
    }
    assert_eq!(all[0], all[1], "{name}");
    // And a prompt split in two batches at any point gives the same bits again.
    for cut in 1..prompt.len() {
        let mut dec = common::open(
            &dir,
            &opts(BackendKind::Pread, Isa::best(), 2, true, stream(0), 64, 0),
        );
        let mut rows = dec.feed(&prompt[..cut], true).expect("feed");
        rows.extend(dec.feed(&prompt[cut..], true).expect("feed"));
        assert_eq!(common::bits(&rows), all[0], "{name}: cut at {cut}");
    }
}

#[test]
fn a_prompt_reads_each_selected_expert_once() {
    let name = "qwen3_moe_b";
    let dir = common::model(name);
    let prompt = &common::reference(name)[0].prompt_ids;
    let mut dec = common::open(
        &dir,
        &opts(BackendKind::Pread, Isa::best(), 2, true, stream(0), 64, 0),
    );
    dec.feed(prompt, false).expect("feed");
    let s = dec.expert_stats();
    // 2 MoE layers × 8 experts: at most 16 distinct experts, each read once however many of the
    // prompt's tokens chose it.
    assert!(s.reads <= 16, "{s:?}");
    assert_eq!(s.reads, s.cache_misses);
    assert!(
        prompt.len() as u64 * 3 * 2 > s.reads,
        "the prompt shares experts between tokens"
    );
}

#[test]
fn a_partial_cache_stays_within_its_size_hits_and_evicts() {
    let name = "qwen3_moe_b";
    let dir = common::model(name);
    let total = common::open(&dir, &DecoderOptions::default())
        .experts()
        .total_bytes();
    let cap = total / 3;
    let mut dec = common::open(
        &dir,
        &opts(BackendKind::Pread, Isa::best(), 2, true, stream(cap), 64, 0),
    );
    for p in common::reference(name) {
        common::greedy(&mut dec, &p.prompt_ids, 12);
        assert!(dec.experts().cached_bytes() <= cap, "cache over its size");
    }
    let s = dec.expert_stats();
    assert!(s.cache_hits > 0, "{s:?}");
    // Reads beyond the distinct experts mean something was evicted and read again.
    assert!(s.reads > 16, "{s:?}");
    assert_eq!(s.reads, s.cache_misses);
}

/// Thread counts 1, 2, 3 and 7 on a model whose products really split (`common::split_model`):
/// the same logits bits at every step, for every ISA, prompt batched or not, streamed or resident,
/// products split in chunks from a counter (the default) and in equal static shares; and with
/// more than one thread and static shares, products were computed by several threads (counted by
/// the kernels), so the equality is not that of one thread doing all the work. (With chunks a
/// thread that starts late may find none left, so only static shares are sure to divide.)
#[test]
fn thread_counts_that_really_split_the_products_change_no_bit() {
    let dir = common::split_model();
    let prompt: Vec<u32> = vec![5, 17, 99, 3, 42, 7, 11, 64];
    let run = |o: &DecoderOptions| {
        let mut dec = common::open(&dir, o);
        let (t, rows) = common::greedy(&mut dec, &prompt, 6);
        (t, common::bits(&rows))
    };
    let base = run(&opts(
        BackendKind::Pread,
        Isa::Scalar,
        1,
        false,
        stream(0),
        64,
        0,
    ));
    let resident = ExpertOptions {
        mode: ExpertMode::Resident,
        cache_bytes: 0,
    };
    for static_split in [false, true] {
        tarfa_decode::kernels::set_static_split(static_split);
        for &isa in &Isa::available_all() {
            for threads in [1, 2, 3, 7] {
                for batch in [false, true] {
                    for c in [stream(0), resident.clone()] {
                        let before = tarfa_decode::kernels::products_split();
                        let o = opts(BackendKind::Pread, isa, threads, batch, c, 64, 0);
                        assert_eq!(run(&o), base, "static {static_split}: {o:?}");
                        let split = tarfa_decode::kernels::products_split() - before;
                        if threads > 1 && static_split {
                            assert!(split > 0, "no product was split over threads: {o:?}");
                        }
                    }
                }
            }
        }
    }
    tarfa_decode::kernels::set_static_split(false);
}

/// A prompt in chunks of 1, 2, 7, 64 and 512 tokens (`prompt_chunk`, `tarfa run --batch N`)
/// gives every position the bits of the whole prompt in one batch: on every family's fixture
/// (their reference prompts), and on the model whose products split over threads with a
/// 100-token prompt, at 3 threads.
#[test]
fn a_prompt_in_chunks_of_any_size_gives_the_same_bits() {
    let long: Vec<u32> = (0..100u32).map(|i| (i * 37 + 5) % 128).collect();
    let mut cases: Vec<(String, std::path::PathBuf, Vec<u32>)> = NAMES
        .iter()
        .map(|&n| {
            (
                n.to_string(),
                common::model(n),
                common::reference(n)[0].prompt_ids.clone(),
            )
        })
        .collect();
    cases.push(("split".into(), common::split_model(), long));
    for (name, dir, prompt) in cases {
        let feed = |chunk: usize| {
            let mut o = opts(BackendKind::Pread, Isa::best(), 3, true, stream(0), 64, 0);
            o.prompt_chunk = chunk;
            let mut dec = common::open(&dir, &o);
            let rows = dec.feed(&prompt, true).expect("feed");
            assert_eq!(rows.len(), prompt.len());
            // And the next token's logits, after the chunks.
            let next = dec.feed(&[3], false).expect("feed");
            (common::bits(&rows), common::bits(&next))
        };
        let whole = feed(0);
        for chunk in [1, 2, 7, 64, 512] {
            assert_eq!(feed(chunk), whole, "{name}: chunks of {chunk}");
        }
    }
}
