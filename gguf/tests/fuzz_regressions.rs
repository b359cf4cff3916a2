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
