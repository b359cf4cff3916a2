//! `tarfa run` as a user runs it: text and ids equal to transformers' greedy output on the
//! bundled fixture, .npy logits byte-identical across I/O, cache, thread and kernel choices, and
//! a damaged or incomplete model refused with the fault named and no token printed from it.

mod common;

use std::path::{Path, PathBuf};

use common::{path, tarfa};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hf")
        .join(name)
}

fn reference(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/reference")
        .join(name)
        .join("reference.json");
    serde_json::from_slice(&std::fs::read(p).expect("reference.json")).expect("json")
}

fn convert(name: &str, out: &Path, extra: &[&str]) {
    let src = fixture(name);
    let mut args = vec!["convert", path(&src), "-o", path(out), "--quiet"];
    args.extend_from_slice(extra);
    let (code, _, err) = tarfa(&args);
    assert_eq!(code, 0, "convert: {err}");
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[test]
fn run_prints_the_text_and_ids_transformers_generates() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let r = reference("qwen3_moe");
    for p in r["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("text");
        // Text mode: the tokenizer from the model directory, greedy text on stdout.
        let (code, out, err) = tarfa(&["run", path(&model), "--prompt", text, "-n", "32"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out.trim_end_matches('\n'),
            p["fp32_text"].as_str().expect("fp32_text")
        );
        assert!(
            err.contains("tokens/s") && err.contains("experts:"),
            "summary on stderr: {err}"
        );
        // JSON: the prompt's ids are the reference's, the tokens transformers' fp32 tokens.
        let (code, out, err) =
            tarfa(&["run", path(&model), "--prompt", text, "-n", "32", "--json"]);
        assert_eq!(code, 0, "{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
        assert_eq!(doc["schema"], "tarfa.run/1");
        assert_eq!(
            ids(&doc["prompt_tokens"]),
            ids(&p["prompt_ids"]),
            "tokenizer agrees"
        );
        assert_eq!(ids(&doc["tokens"]), ids(&p["fp32_tokens"]));
        // --tokens: ids in, ids out, space-separated.
        let prompt_ids: Vec<String> = ids(&p["prompt_ids"])
            .iter()
            .map(|i| i.to_string())
            .collect();
        let (code, out, err) = tarfa(&[
            "run",
            path(&model),
            "--tokens",
            &prompt_ids.join(","),
            "-n",
            "32",
        ]);
        assert_eq!(code, 0, "{err}");
        let want: Vec<String> = ids(&p["fp32_tokens"])
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(out.trim_end(), want.join(" "));
    }
}

#[test]
fn run_prints_transformers_text_for_every_family() {
    // One prompt per family fixture (text in, text out): the families beyond qwen3_moe.
    for name in [
        "mixtral",
        "glm4_moe_b",
        "qwen3_5_moe_text",
        "qwen3_next",
        "mimo_v2_flash",
        "deepseek_v3",
        "glm5_next",
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let model = tmp.path().join("m");
        convert(name, &model, &[]);
        let r = reference(name);
        let p = &r["prompts"][0];
        // The references were made with no end-of-sequence token (mixtral's, 2, is the 14th
        // greedy token): --ignore-eos runs as they did.
        let (code, out, err) = tarfa(&[
            "run",
            path(&model),
            "--prompt",
            p["text"].as_str().expect("text"),
            "-n",
            "32",
            "--ignore-eos",
        ]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(
            out.trim_end_matches('\n'),
            p["fp32_text"].as_str().expect("fp32_text"),
            "{name}"
        );
    }
}

/// Issue 26, finding 19: a run stops after the model's end-of-sequence token (here mixtral's
/// generation_config.json eos_token_id 2, transformers' 14th greedy token of the reference, made
/// with no eos), which is not printed as text; --ignore-eos gives exactly -n; --json says why
/// it stopped. The prompt is read from a file or standard input as from --prompt.
#[test]
fn a_run_stops_at_the_models_end_of_sequence_token() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("mixtral", &model, &[]);
    let r = reference("mixtral");
    let p = &r["prompts"][0];
    let text = p["text"].as_str().expect("text");
    let want = ids(&p["fp32_tokens"]);
    let eos_at = want
        .iter()
        .position(|&t| t == 2)
        .expect("the reference has eos 2");
    let run_json = |extra: &[&str]| {
        let mut args = vec!["run", path(&model), "-n", "32", "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = tarfa(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("json")
    };
    let stopped = run_json(&["--prompt", text]);
    assert_eq!(ids(&stopped["tokens"]), want[..=eos_at], "{stopped}");
    assert_eq!(stopped["finish_reason"], "stop", "{stopped}");
    assert_eq!(
        stopped["eos_token_ids"],
        serde_json::json!([2]),
        "{stopped}"
    );
    let full = run_json(&["--prompt", text, "--ignore-eos"]);
    assert_eq!(ids(&full["tokens"]), want, "{full}");
    assert_eq!(full["finish_reason"], "length", "{full}");
    // The text stops before the eos token, which is not printed.
    let (code, out, err) = tarfa(&["run", path(&model), "-p", text, "-n", "32"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim_end_matches('\n'),
        stopped["text"].as_str().expect("text")
    );
    assert!(
        p["fp32_text"]
            .as_str()
            .expect("fp32_text")
            .starts_with(out.trim_end_matches('\n')),
        "{out}"
    );
    assert!(
        err.contains("stopped at the end-of-sequence token 2 (of 32 asked for"),
        "{err}"
    );
    // --prompt-file FILE and - (standard input): the same prompt ids.
    let file = tmp.path().join("prompt.txt");
    std::fs::write(&file, text).expect("write");
    let from_file = run_json(&["--prompt-file", path(&file)]);
    assert_eq!(from_file["prompt_tokens"], stopped["prompt_tokens"]);
    for name in ["-", "/dev/stdin"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tarfa"))
            .args(["run", path(&model), "-f", name, "-n", "32", "--json"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(text.as_bytes()).expect("stdin");
        }
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success());
        let from_stdin: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(from_stdin["tokens"], stopped["tokens"], "{name}");
    }
    // Not UTF-8: refused by name.
    std::fs::write(&file, b"ab\xffcd").expect("write");
    let (code, _, err) = tarfa(&["run", path(&model), "-f", path(&file), "-n", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not UTF-8 text (byte 2"), "{err}");
}

#[test]
fn logits_files_are_byte_identical_across_backends_caches_threads_and_kernels() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe_b", &model, &[]);
    let configs: &[&[&str]] = &[
        &[
            "--backend",
            "pread",
            "--isa",
            "scalar",
            "--threads",
            "1",
            "--no-batch-prompt",
        ],
        &["--backend", "mmap", "--threads", "2"],
        &["--qd", "1", "--ring-slots", "1", "--cache-gib", "0.00001"],
        &["--experts", "resident", "--threads", "3"],
        &["--cache-gib", "1", "--qd", "256"],
        // The 4-token prompt in batches of 3 then 1 (chunked prefill).
        &["--batch", "3", "--threads", "2"],
    ];
    let mut files = Vec::new();
    for (i, extra) in configs.iter().enumerate() {
        let out = tmp.path().join(format!("logits{i}.npy"));
        let mut args = vec!["run", path(&model), "--tokens", "5,17,99,3", "-n", "16"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--logits-out", path(&out)]);
        let (code, _, err) = tarfa(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        files.push(std::fs::read(&out).expect("npy"));
    }
    assert_eq!(files[0].len(), 128 + 16 * 128 * 4, "header + [16, 128] f32");
    for (i, f) in files.iter().enumerate() {
        assert!(
            f == &files[0],
            "config {:?} wrote different logits",
            configs[i]
        );
    }
}

/// Flip one byte inside every expert's gate projection of layer 0.
fn corrupt_layer0_experts(model: &Path) {
    let file = model.join("layer-00000.jnf");
    let r = tarfa_format::JnfReader::open(&file).expect("open");
    let offsets: Vec<u64> = r
        .regions()
        .iter()
        .filter(|g| g.role == tarfa_format::Role::Gate.code())
        .map(|g| g.offset + 3)
        .collect();
    drop(r);
    let mut bytes = std::fs::read(&file).expect("read");
    for o in offsets {
        bytes[o as usize] ^= 0x40;
    }
    std::fs::write(&file, bytes).expect("write");
}

#[test]
fn a_corrupted_expert_stops_run_with_its_name_and_no_token_from_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    corrupt_layer0_experts(&model);
    for backend in ["io_uring", "pread", "mmap"] {
        let (code, out, err) = tarfa(&[
            "run",
            path(&model),
            "--tokens",
            "1,2,3",
            "-n",
            "4",
            "--backend",
            backend,
        ]);
        assert_eq!(code, 1, "{backend}: {err}");
        assert!(
            out.trim().is_empty(),
            "{backend}: printed {out:?} from a corrupt expert"
        );
        assert!(
            err.contains("expert (layer 0, expert")
                && err.contains("BLAKE3 mismatch")
                && err.contains("layer-00000.jnf"),
            "{backend}: {err}"
        );
    }
}

#[test]
fn an_incomplete_or_altered_model_does_not_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let part = tmp.path().join("part");
    convert("qwen3_moe", &part, &["--layers", "0-0"]);
    let (code, out, err) = tarfa(&["run", path(&part), "--tokens", "1", "-n", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    // The missing layers named, and the hint says how to add them: a part is not a damaged
    // model, so neither "changed after conversion" nor the damaged-JNF-file hint.
    assert!(
        err.contains("incomplete") && err.contains("1 of 2 layers missing (1)"),
        "{err}"
    );
    assert!(
        err.lines().any(|l| l.starts_with("hint: ")
            && l.contains("tarfa convert")
            && l.contains("--layers 1")),
        "{err}"
    );
    assert!(
        !err.contains("changed after conversion") && !err.contains("breaks a rule"),
        "{err}"
    );

    // A tokenizer.json changed after conversion is refused before anything runs.
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let tk = model.join("tokenizer.json");
    let mut t = std::fs::read(&tk).expect("read");
    t.push(b' ');
    std::fs::write(&tk, t).expect("write");
    let (code, _, err) = tarfa(&["run", path(&model), "--prompt", "hi", "-n", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    for args in [
        vec!["--tokens", "128", "-n", "1"],
        vec!["--tokens", "1", "--threads", "0"],
        vec!["--tokens", "1", "--isa", "sse9"],
        vec!["--tokens", "1", "--cache-gib", "-1"],
        vec!["--tokens", "1", "--experts", "lazy"],
        // Flags that do not apply are refused, not dropped.
        vec!["--tokens", "1", "--experts", "resident", "--cache-gib", "1"],
        vec!["--tokens", "1", "--vram-gib", "4"],
        vec!["--tokens", "1", "--device", "cpu", "--gpu-experts", "0.5"],
        vec!["--tokens", "1", "--cpu-trunk"],
        vec!["--tokens", "1", "--gpu-offload-only"],
        vec!["--tokens", "1", "--no-cuda-graphs"],
        vec!["--tokens", "1", "--n-cpu-moe", "1"],
    ] {
        let mut a = vec!["run", path(&model)];
        a.extend_from_slice(&args);
        let (code, out, err) = tarfa(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.trim().is_empty(), "{args:?}: {out}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
}

/// Issue 26, finding 12: `run` reads the model's context (the fixture's
/// `max_position_embeddings` is 256) and refuses, before any token is computed, a prompt and
/// `-n` that would run past it — `-n 2^64−1` included — saying how many it may ask; a prompt of
/// more positions than the context; and an id outside the vocabulary even with `-n 0`. Up to the
/// context exactly, it runs.
#[test]
fn run_refuses_more_positions_than_the_context_and_ids_outside_the_vocabulary() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let long: Vec<String> = (0..257).map(|i| (i % 100).to_string()).collect();
    let long = long.join(",");
    for (args, says) in [
        (vec!["--tokens", "1,2", "-n", "300"], "at most 255 tokens"),
        (
            vec!["--tokens", "1", "-n", "18446744073709551615"],
            "beyond the 256 this run may take (the model's context",
        ),
        (
            vec!["--tokens", long.as_str(), "-n", "1"],
            "exceed the 256 positions this run may take (the model's context",
        ),
        (
            vec!["--tokens", "1,2", "-n", "8", "-c", "8"],
            "at most 7 tokens",
        ),
        (
            vec!["--tokens", "1,2", "-n", "1", "-c", "257"],
            "the model's context is 256 positions",
        ),
        (vec!["--tokens", "999", "-n", "0"], "token 999 is outside"),
    ] {
        let mut a = vec!["run", path(&model)];
        a.extend_from_slice(&args);
        let (code, out, err) = tarfa(&a);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.trim().is_empty(), "{args:?}: no token printed: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // 2 prompt tokens and 255 generated take 256 positions: the whole context.
    let (code, out, err) = tarfa(&["run", path(&model), "--tokens", "1,2", "-n", "255"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().count(), 255, "{out}");
}

#[test]
fn a_closed_stdout_ends_run_quietly_with_the_sigpipe_status() {
    use std::io::Read;
    let tmp = tempfile::tempdir().expect("tmp");
    // The fixture with a context of a million positions, so that the run outlasts the pipe.
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    for f in std::fs::read_dir(fixture("qwen3_moe")).expect("fixture") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, src.join(f.file_name().expect("name"))).expect("copy");
    }
    let cfg = src.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).expect("config")).expect("json");
    c["max_position_embeddings"] = 1_000_000.into();
    std::fs::write(&cfg, serde_json::to_vec(&c).expect("json")).expect("write");
    let model = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(["run", path(&model), "--tokens", "1,2", "-n", "900000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = [0u8; 8];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut first)
        .expect("some ids"); // the pipe closes when the handle drops here
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--device cuda` on a build or machine without CUDA is a clear error (exit 2), never a panic;
/// `--device auto` runs on the CPU; a bad `--gpu-experts` is refused.
#[test]
fn device_cuda_without_cuda_is_a_clear_error_and_auto_falls_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let (code, out, err) = tarfa(&[
        "run",
        path(&model),
        "--tokens",
        "1,2",
        "-n",
        "2",
        "--device",
        "cuda",
    ]);
    if cfg!(feature = "cuda") && code == 0 {
        // A CUDA build on a machine with a GPU: it ran there (the GPU tests compare the bits).
        assert!(err.contains("gpu: "), "{err}");
    } else {
        assert_eq!(code, 2, "stdout {out}, stderr {err}");
        assert!(err.contains("CUDA"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let (code, _, err) = tarfa(&[
        "run",
        path(&model),
        "--tokens",
        "1,2",
        "-n",
        "2",
        "--device",
        "auto",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tarfa(&[
        "run",
        path(&model),
        "--tokens",
        "1,2",
        "--device",
        "cuda",
        "--gpu-experts",
        "1.5",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--gpu-experts"), "{err}");
}

#[test]
fn a_tokenizer_that_is_a_fifo_or_a_link_to_a_device_is_refused_at_once_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let tk = model.join("tokenizer.json");
    for kind in ["a FIFO", "a character device"] {
        std::fs::remove_file(&tk).expect("rm");
        if kind == "a FIFO" {
            let ok = std::process::Command::new("mkfifo")
                .arg(&tk)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "mkfifo");
        } else {
            std::os::unix::fs::symlink("/dev/zero", &tk).expect("symlink");
        }
        let (code, out, err) =
            common::tarfa_within(60, &["run", path(&model), "--prompt", "hi", "-n", "1"]);
        assert_eq!(code, 1, "{kind}: {err}");
        assert!(out.trim().is_empty(), "{kind}: {out}");
        assert!(
            err.contains(&format!("{}: {kind}, not a regular file", tk.display())),
            "{kind}: {err}"
        );
    }
}

/// `--logits-out` never replaces what is not a regular file of its own (issue 26, findings 1, 2
/// and 10): one of the model's files (or a hard link to one), or a new file in the model
/// directory, is refused and the model left as it was; a
/// symbolic link is refused naming its target; a FIFO is written into as a stream and stays a
/// FIFO, with the bytes a regular file gets; a character device is written into (`/dev/full`'s
/// "no space" is the error) and stays a device; and a path that cannot be written fails before
/// any token is computed.
#[test]
fn logits_out_never_replaces_a_device_a_fifo_a_link_or_an_input() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe_b", &model, &[]);
    let run = |out: &Path| {
        common::tarfa_within(
            120,
            &[
                "run",
                path(&model),
                "--tokens",
                "5,17,99",
                "-n",
                "4",
                "--logits-out",
                path(out),
            ],
        )
    };
    // The reference: a regular file.
    let plain = tmp.path().join("plain.npy");
    let (code, _, err) = run(&plain);
    assert_eq!(code, 0, "{err}");
    let want = std::fs::read(&plain).expect("npy");
    assert_eq!(want.len(), 128 + 4 * 128 * 4, "header + [4, 128] f32");
    // Inputs: the manifest itself, and a hard link to a layer file from outside the model.
    let manifest = model.join("manifest.json");
    let before = std::fs::read(&manifest).expect("manifest");
    let hard = tmp.path().join("hard.npy");
    std::fs::hard_link(model.join("trunk.jnf"), &hard).expect("hard link");
    let trunk = std::fs::read(&hard).expect("trunk");
    for input in [&manifest, &hard] {
        let (code, out, err) = run(input);
        assert_ne!(code, 0, "{}: {err}", input.display());
        assert!(out.trim().is_empty(), "no token before the refusal: {out}");
        assert!(err.contains("an input of this command"), "{err}");
    }
    assert_eq!(std::fs::read(&manifest).expect("manifest"), before);
    assert_eq!(std::fs::read(&hard).expect("trunk"), trunk);
    // A symbolic link: refused, naming its target, which is not created.
    let target = tmp.path().join("target.npy");
    let link = tmp.path().join("link.npy");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let (code, _, err) = run(&link);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&format!("a symbolic link to {}", target.display())),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    assert!(!target.exists());
    // A FIFO: the rows arrive through it, and it is still a FIFO.
    let fifo = tmp.path().join("fifo");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo");
    // The reader is waited for with a limit: a run that never opens the FIFO fails the test
    // instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let fifo = fifo.clone();
        std::thread::spawn(move || tx.send(std::fs::read(&fifo).expect("read the FIFO")));
    }
    let (code, _, err) = run(&fifo);
    assert_eq!(code, 0, "{err}");
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the FIFO's reader got the rows");
    assert_eq!(got, want, "the FIFO got the file's bytes");
    assert!(std::fs::symlink_metadata(&fifo)
        .expect("fifo")
        .file_type()
        .is_fifo());
    // A character device is written into, never replaced.
    let full = Path::new("/dev/full");
    if std::fs::metadata(full).is_ok_and(|m| m.file_type().is_char_device()) {
        let (code, _, err) = run(full);
        assert_ne!(code, 0, "/dev/full accepts nothing: {err}");
        assert!(err.contains("/dev/full"), "{err}");
        let m = std::fs::symlink_metadata(full).expect("/dev/full");
        assert!(
            m.file_type().is_char_device(),
            "/dev/full is still a device"
        );
    }
    // Paths that cannot be written, a new file in the model directory and a path ending in
    // '/': refused before the model is run, nothing left behind.
    let entries = |d: &Path| std::fs::read_dir(d).expect("ls").count();
    let in_model = entries(&model);
    for bad in [
        tmp.path().join("no-such-dir").join("x.npy"),
        model.join("logits.npy"),
        PathBuf::from(format!("{}/", tmp.path().join("new.npy").display())),
    ] {
        let (code, out, err) = run(&bad);
        assert_ne!(code, 0, "{}: {err}", bad.display());
        assert!(out.trim().is_empty(), "no token before the refusal: {out}");
        assert!(err.contains("--logits-out"), "{err}");
    }
    assert_eq!(entries(&model), in_model, "nothing written into the model");
    assert!(!tmp.path().join("new.npy").exists());
}

/// What a new user reads (issue 26, finding 23): a missing model directory is named as such, not
/// as the manifest inside it; the summary counts the tokens asked for (`-n 4`: 4 generated, the
/// first from the prompt's pass, then 3 decode steps).
#[test]
fn a_missing_model_is_named_and_the_summary_counts_the_tokens_asked_for() {
    let tmp = tempfile::tempdir().expect("tmp");
    let missing = tmp.path().join("no-model");
    let (code, _, err) = tarfa(&["run", path(&missing), "--tokens", "5", "-n", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{}: no such model directory", missing.display())),
        "{err}"
    );
    assert!(!err.contains("manifest.json: open"), "{err}");
    let model = tmp.path().join("m");
    convert("qwen3_moe_b", &model, &[]);
    for (n, want) in [
        (
            "4",
            "generated 4 tokens: the first from the prompt's pass, then 3 decode steps in ",
        ),
        ("1", "generated 1 token, from the prompt's pass\n"),
    ] {
        let (code, out, err) = tarfa(&["run", path(&model), "--tokens", "5,17", "-n", n]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out.split_whitespace().count(),
            n.parse::<usize>().expect("n"),
            "{out}"
        );
        assert!(err.contains(want), "-n {n}: {err}");
    }
}

/// A damaged layer file is refused as a damaged trunk is (issue 26, finding 13): exit 1, the
/// file named, and the hint that the file breaks the format's rules.
#[test]
fn a_damaged_layer_file_gets_the_trunks_exit_code_and_hint() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe_b", &model, &[]);
    for file in ["trunk.jnf", "layer-00001.jnf"] {
        let damaged = tmp.path().join(format!("d-{file}"));
        let mut cp = std::process::Command::new("cp");
        let ok = cp
            .arg("-r")
            .arg(&model)
            .arg(&damaged)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cp");
        let p = damaged.join(file);
        let mut bytes = std::fs::read(&p).expect("read");
        bytes[..4].copy_from_slice(b"XXXX");
        std::fs::write(&p, &bytes).expect("write");
        let (code, out, err) = tarfa(&["run", path(&damaged), "--tokens", "5,17", "-n", "2"]);
        assert_eq!(code, 1, "{file}: {err}");
        assert!(out.trim().is_empty(), "{file}: {out}");
        assert!(
            err.contains(&format!("{}: bad magic", p.display())),
            "{err}"
        );
        assert!(
            err.contains("hint: the file breaks a rule of spec/JNF_V1.md"),
            "{file}: {err}"
        );
    }
}

/// What a run does not use, it does not load (issue 26, finding 11): the expert ring is bounded
/// by the model — `--qd` and `--ring-slots` far beyond a layer's experts are reduced to what it
/// can use, with a warning, and the logits are the same bits — and a `--tokens` run printing ids
/// never reads `tokenizer.json` (here one that fails its check: a `--prompt` run is refused
/// naming it, a `--tokens` run is not).
#[test]
fn a_run_loads_only_what_it_uses_and_bounds_the_ring_by_the_model() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe_b", &model, &[]);
    let plain = tmp.path().join("plain.npy");
    let big = tmp.path().join("big.npy");
    let base = ["run", path(&model), "--tokens", "5,17,99", "-n", "3"];
    let (code, _, err) = tarfa(&[&base[..], &["--logits-out", path(&plain)]].concat());
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tarfa(
        &[
            &base[..],
            &["--qd", "4096", "--ring-slots", "65536", "--json"],
            &["--logits-out", path(&big)],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    // 8 experts a layer: 8 reads in flight, 8 + 16 slots.
    assert!(
        err.contains("warning: --qd 4096: this model uses at most 8 reads in flight"),
        "{err}"
    );
    assert!(
        err.contains("warning: --ring-slots 65536: this model uses at most 24 slots"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    let backend = doc["experts"]["backend"].as_str().expect("backend");
    assert!(
        backend.contains("QD 8)") && backend.contains("ring 24 ×"),
        "{backend}"
    );
    assert_eq!(
        std::fs::read(&plain).expect("plain"),
        std::fs::read(&big).expect("big")
    );

    let tk = model.join("tokenizer.json");
    let mut bytes = std::fs::read(&tk).expect("tokenizer");
    bytes[10] ^= 1;
    std::fs::write(&tk, bytes).expect("write");
    let (code, out, err) = tarfa(&base);
    assert_eq!(code, 0, "a --tokens run read tokenizer.json: {err}");
    assert_eq!(out.split_whitespace().count(), 3, "{out}");
    let (code, _, err) = tarfa(&["run", path(&model), "--prompt", "hi", "-n", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("tokenizer.json"), "{err}");
}

/// llama.cpp's habits (issue 26, finding 20): `-p`, `-n`, `-t` and `-c` are taken as there;
/// `--temp 0` (greedy there too) is taken; a sampling flag is refused by name, saying that run is
/// greedy, not suggested as a flag of another meaning (`--temperature` suggested `--experts`).
/// And one meaning per flag name (finding 26): bench-decode's steps are `-n/--max-tokens` and
/// bench-io's `--steps` and `--check`, the old names taken with a warning.
#[test]
fn llama_cpp_habits_are_taken_or_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    convert("qwen3_moe", &model, &[]);
    let (code, long, err) = tarfa(&[
        "run",
        path(&model),
        "--prompt",
        "The quick brown fox",
        "--max-tokens",
        "4",
        "--threads",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, short, err) = tarfa(&[
        "run",
        path(&model),
        "-p",
        "The quick brown fox",
        "-n",
        "4",
        "-t",
        "2",
        "-c",
        "64",
        "--temp",
        "0",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(short, long);
    for (flag, value) in [
        ("--temperature", "0.8"),
        ("--temp", "0.7"),
        ("--top-p", "0.9"),
        ("--top-k", "40"),
        ("--min-p", "0.05"),
        ("--seed", "42"),
        ("--repeat-penalty", "1.1"),
    ] {
        let (code, out, err) = tarfa(&["run", path(&model), "-p", "hi", flag, value]);
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("does not sample; it decodes greedily"),
            "{flag}: {err}"
        );
        assert!(!err.contains("--experts"), "{flag}: {err}");
    }
    let (code, _, err) = tarfa(&[
        "bench-decode",
        path(&model),
        "--modes",
        "resident",
        "--runs",
        "1",
        "--tokens",
        "2",
        "--mem-gib",
        "0.01",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: bench-decode --tokens is now -n/--max-tokens"),
        "{err}"
    );
    let (code, _, err) = tarfa(&["bench-decode", path(&model), "--tokens", "2", "-n", "3"]);
    assert_eq!(code, 2, "both spellings at once: {err}");
    let (code, out, err) = tarfa(&[
        "bench-io",
        path(&model),
        "--verify",
        "off",
        "--tokens",
        "2",
        "--backend",
        "pread",
        "--qd",
        "1",
        "--runs",
        "1",
        "--no-fio",
        "--no-drop-caches",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: bench-io --tokens is now --steps"),
        "{err}"
    );
    assert!(
        err.contains("warning: bench-io --verify is now --check"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(doc["tokens"], 2, "{doc}");
    assert_eq!(doc["rows"].as_array().map(Vec::len), Some(1), "{doc}");
}
