//! Arbitrary bytes as a GGUF file. The header parser must refuse or accept without panicking,
//! give the same answer from a whole buffer and from a growing window, and an accepted file must
//! survive a rewrite: our writer re-emits it, the reader accepts the result, and a second rewrite
//! is byte-identical with the same tensor bytes.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use tarfa_gguf::header::read_header_from;
use tarfa_gguf::{expert_range, parse_header, ByteSource, GgufWriter, Header, MemSource};

fn rewrite(h: &Header, src: &dyn ByteSource) -> Vec<u8> {
    let mut w = GgufWriter::new(h.alignment);
    for (k, v) in &h.metadata {
        w.add_kv(k.clone(), v.clone());
    }
    for t in &h.tensors {
        w.add_tensor(t.name.clone(), t.dtype, t.ne.clone());
    }
    let data: Vec<Vec<u8>> = h
        .tensors
        .iter()
        .map(|t| {
            let mut b = vec![0u8; t.byte_len as usize];
            src.read_at(t.data_offset, &mut b)
                .expect("tensor inside the file");
            b
        })
        .collect();
    let mut out = Vec::new();
    w.write_to(
        &mut out,
        data.iter().map(|d| Box::new(d.as_slice()) as Box<dyn Read>),
        "fuzz",
    )
    .expect("an accepted header must be writable");
    out
}

fuzz_target!(|data: &[u8]| {
    let whole = parse_header(data, data.len() as u64);
    let src = MemSource::new("fuzz", data.to_vec());
    let initial = u64::from(data.first().copied().unwrap_or(1)) + 1;
    let grown = read_header_from(&src, initial);
    let h = match (whole, grown) {
        (Ok(a), Ok(b)) => {
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            b
        }
        (Err(tarfa_gguf::HeaderParse::Invalid(a)), Err(b)) => {
            assert_eq!(Some(&a), b.violation());
            return;
        }
        (a, b) => panic!("whole buffer and window disagree: {a:?} / {b:?}"),
    };
    for t in &h.tensors {
        if t.ne.len() == 3 {
            let n = t.shape()[0];
            if n > 0 {
                let last = expert_range(t, n - 1).expect("last expert");
                assert_eq!(last.end, t.data_offset + t.byte_len);
            }
        }
    }
    // Tensor data is bounded by the input length, so rewriting stays small.
    let once = rewrite(&h, &src);
    let src2 = MemSource::new("fuzz-rewrite", once.clone());
    let h2 = read_header_from(&src2, 4096).expect("the reader accepts what the writer wrote");
    let twice = rewrite(&h2, &src2);
    assert_eq!(once, twice, "rewrite is not idempotent");
});
