//! Shared by the fetch tests (and, through `#[path]`, the binary's resume test): a generated
//! GLM-style split GGUF with MTP blocks, nginx on loopback, and a fault-injecting HTTP server.
#![allow(dead_code)]

pub mod server;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tarfa_gguf::{Array, Dtype, GgufWriter, Value};

/// Deterministic bytes (xorshift64*), so runs are reproducible.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// The generated model: its parts and what the MTP selection must give.
#[derive(Debug)]
pub struct GlmModel {
    /// `glm-0000k-of-0000N.gguf`, in order.
    pub parts: Vec<PathBuf>,
    /// Names of the MTP tensors (blocks `block_count - nextn ..`), in file order.
    pub mtp_tensors: Vec<String>,
    /// Their exact bytes in all.
    pub mtp_bytes: u64,
}

pub const N_EMBD: u64 = 256;
pub const N_EXPERT: u64 = 32;
pub const BLOCKS: u64 = 5;
pub const NEXTN: u64 = 2;

fn dt(name: &str) -> Dtype {
    Dtype::from_name(name).expect("dtype in table")
}

/// Tensors of block `b` (GGUF `ne` order), GLM-4.5-MoE style: attention, router, expert stacks
/// in quantized types, shared expert, and for MTP blocks the `nextn.*` tensors.
fn block_tensors(b: u64, mtp: bool) -> Vec<(String, Dtype, Vec<u64>)> {
    let e = N_EMBD;
    let mut v = vec![
        ("attn_norm.weight", dt("F32"), vec![e]),
        ("attn_q.weight", dt("Q8_0"), vec![e, e]),
        ("attn_k.weight", dt("Q8_0"), vec![e, e / 2]),
        ("attn_v.weight", dt("Q8_0"), vec![e, e / 2]),
        ("attn_output.weight", dt("Q8_0"), vec![e, e]),
        ("post_attention_norm.weight", dt("F32"), vec![e]),
        ("ffn_gate_inp.weight", dt("F32"), vec![e, N_EXPERT]),
        ("exp_probs_b.bias", dt("F32"), vec![N_EXPERT]),
        ("ffn_gate_exps.weight", dt("Q4_K"), vec![e, e, N_EXPERT]),
        ("ffn_up_exps.weight", dt("Q4_K"), vec![e, e, N_EXPERT]),
        ("ffn_down_exps.weight", dt("Q6_K"), vec![e, e, N_EXPERT]),
        ("ffn_gate_shexp.weight", dt("Q8_0"), vec![e, e]),
        ("ffn_up_shexp.weight", dt("Q8_0"), vec![e, e]),
        ("ffn_down_shexp.weight", dt("Q8_0"), vec![e, e]),
    ];
    if mtp {
        v.extend([
            ("nextn.eh_proj.weight", dt("Q8_0"), vec![2 * e, e]),
            ("nextn.enorm.weight", dt("F32"), vec![e]),
            ("nextn.hnorm.weight", dt("F32"), vec![e]),
            ("nextn.shared_head_norm.weight", dt("F32"), vec![e]),
        ]);
    }
    v.into_iter()
        .map(|(n, d, ne)| (format!("blk.{b}.{n}"), d, ne))
        .collect()
}

/// Write `glm-0000k-of-00003.gguf` into `dir`: part 1 holds the key/values, the token
/// embedding and block 0; part 2 blocks 1–2; part 3 blocks 3–4 (the MTP blocks) and the head.
pub fn write_glm(dir: &Path) -> GlmModel {
    let e = N_EMBD;
    let vocab = 1024u64;
    let mut groups: Vec<Vec<(String, Dtype, Vec<u64>)>> = vec![Vec::new(), Vec::new(), Vec::new()];
    groups[0].push(("token_embd.weight".into(), dt("Q8_0"), vec![e, vocab]));
    for b in 0..BLOCKS {
        let g = match b {
            0 => 0,
            1 | 2 => 1,
            _ => 2,
        };
        groups[g].extend(block_tensors(b, b >= BLOCKS - NEXTN));
    }
    groups[2].push(("output_norm.weight".into(), dt("F32"), vec![e]));
    groups[2].push(("output.weight".into(), dt("Q8_0"), vec![e, vocab]));
    let total: usize = groups.iter().map(Vec::len).sum();
    let tokens: Vec<String> = (0..vocab).map(|i| format!("tok{i}")).collect();
    let mut parts = Vec::new();
    let mut mtp_tensors = Vec::new();
    let mut mtp_bytes = 0;
    let mut seed = 1u64;
    for (i, g) in groups.iter().enumerate() {
        let mut w = GgufWriter::new(32);
        if i == 0 {
            w.add_kv("general.architecture", Value::String("glm4moe".into()))
                .add_kv("general.name", Value::String("GLM-tiny-test".into()))
                .add_kv("glm4moe.block_count", Value::U32(BLOCKS as u32))
                .add_kv("glm4moe.nextn_predict_layers", Value::U32(NEXTN as u32))
                .add_kv("glm4moe.embedding_length", Value::U32(e as u32))
                .add_kv("glm4moe.expert_count", Value::U32(N_EXPERT as u32))
                .add_kv("glm4moe.rope.freq_base", Value::F32(1_000_000.0))
                .add_kv("tokenizer.ggml.model", Value::String("gpt2".into()))
                .add_kv(
                    "tokenizer.ggml.tokens",
                    Value::Array(Array::String(tokens.clone())),
                );
        }
        w.add_kv("split.no", Value::U16(i as u16))
            .add_kv("split.count", Value::U16(groups.len() as u16))
            .add_kv("split.tensors.count", Value::I32(total as i32));
        let mut data: Vec<Box<dyn Read>> = Vec::new();
        for (name, d, ne) in g {
            w.add_tensor(name.clone(), *d, ne.clone());
            let shape: Vec<u64> = ne.iter().rev().copied().collect();
            let n = d.byte_len(&shape).expect("size");
            if crate_mtp(name) {
                mtp_tensors.push(name.clone());
                mtp_bytes += n;
            }
            seed += 1;
            data.push(Box::new(std::io::Cursor::new(bytes(seed, n as usize))));
        }
        let p = dir.join(format!("glm-{:05}-of-{:05}.gguf", i + 1, groups.len()));
        w.write_file(&p, data).expect("write part");
        parts.push(p);
    }
    GlmModel {
        parts,
        mtp_tensors,
        mtp_bytes,
    }
}

fn crate_mtp(name: &str) -> bool {
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|b| b >= BLOCKS - NEXTN)
}

/// An nginx serving `root` on 127.0.0.1 at an ephemeral port, stopped on drop.
pub struct Nginx {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start nginx over `root`; `None` when nginx is missing (skipped, or a failure where tools are
/// required: `tarfa_testtools`).
pub fn start_nginx(root: &Path, test: &str) -> Option<Nginx> {
    let bin = tarfa_testtools::nginx()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("ephemeral port")
        .port();
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  default_type application/octet-stream;\n\
           client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n\
           uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
           server {{ listen 127.0.0.1:{port}; root {}; location / {{ }} }}\n}}\n",
        root.display()
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).expect("write nginx.conf");
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nginx");
    let nginx = Nginx {
        child,
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{test}: nginx did not listen on 127.0.0.1:{port} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(nginx)
}
