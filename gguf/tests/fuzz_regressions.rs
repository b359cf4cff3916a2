//! Inputs the `gguf_reader` fuzz target (fuzz/fuzz_targets/gguf_reader.rs) found, each kept as
//! the property it broke.

use tarfa_gguf::header::read_header_from;
use tarfa_gguf::{parse_header, HeaderParse, MemSource};

/// The whole-buffer parse and the growing-window read must give the same answer.
fn same_answer_whatever_the_window(data: &[u8]) {
    let whole = parse_header(data, data.len() as u64);
    for initial in [1, 14, 64, 4096] {
        let grown = read_header_from(&MemSource::new("input", data.to_vec()), initial);
        match (&whole, &grown) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(HeaderParse::Invalid(a)), Err(b)) => assert_eq!(Some(a), b.violation()),
            (a, b) => panic!("window {initial}: {a:?} / {b:?}"),
        }
    }
}

#[test]
fn html_sniffing_does_not_depend_on_the_window_size() {
    // crash-3961a43087f43d784def45ca9d07f598e8c44c55: 67 CRs, a tab, then "<!doctype html". The
    // whole-buffer parse saw the doctype and the 64-byte window did not.
    let mut data = vec![13u8; 67];
    data.push(9);
    data.extend_from_slice(&[13; 7]);
    data.extend_from_slice(b"<!doctype html\r\r[\0");
    same_answer_whatever_the_window(&data);
    // And past the sniffed prefix, it is just bad magic, whatever the window.
    let mut far = vec![b' '; 600];
    far.extend_from_slice(b"<html>");
    same_answer_whatever_the_window(&far);
}

#[test]
fn a_data_section_starting_past_the_end_is_truncation() {
    // oom-*: general.alignment 2^30 and no tensors was accepted, and the fuzz target's rewrite
    // then padded its output to 1 GiB.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&17u64.to_le_bytes());
    b.extend_from_slice(b"general.alignment");
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&(1u32 << 30).to_le_bytes());
    match parse_header(&b, b.len() as u64) {
        Err(HeaderParse::Invalid(tarfa_gguf::Violation::Truncated { what, .. })) => {
            assert!(what.contains("alignment 1073741824"), "{what}")
        }
        other => panic!("{other:?}"),
    }
    same_answer_whatever_the_window(&b);
}
