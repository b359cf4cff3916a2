//! One test per MUST of `spec/JNF_V1.md`, on hand-built bad bytes: each breach gives its own
//! `Violation`, never a panic and never an allocation larger than the file. Most tests damage a
//! valid file and then *reseal* it (recompute the index hashes, the footer hash and the header
//! hash) so that the damage reaches the rule under test instead of a hash check.

use std::path::Path;

use sha2::Digest;
use tarfa_format::error::{
    Aligned, ExpertRecordFault as EF, NameFault, PaddingAfter, ProvenanceFault as PF, RoleFault,
    ShapeFault, StringFault, UsageFault,
};
use tarfa_format::layout::{Footer, FOOTER_LEN, REGION_RECORD_LEN};
use tarfa_format::source_path::SourcePathFault;
use tarfa_format::{
    Dtype, Error, FileLayout, JnfReader, JnfWriter, Provenance, RegionSpec, Role, Violation,
};

/// A valid file: two plain tensors, then two experts of layer 3 (gate, up, down each).
fn valid_file() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("f.jnf");
    let mut w = JnfWriter::create(&path, FileLayout::layer(3, 2)).expect("create");
    let t = |name: &str, shape: Vec<u64>| RegionSpec {
        name: name.into(),
        dtype: Dtype::BF16,
        shape,
        layer: Some(3),
        source: Some(Provenance {
            file: "model-00001-of-00002.safetensors".into(),
            tensor: name.into(),
            begin: 100,
            shape: vec![],
        }),
    };
    let mut norm = t("norm", vec![100]);
    norm.source.as_mut().expect("src").shape = vec![100];
    w.tensor(&norm, &mut &[7u8; 200][..]).expect("norm");
    let mut router = t("router", vec![2, 8]);
    router.source = None;
    w.tensor(&router, &mut &[9u8; 32][..]).expect("router");
    for e in 0..2u32 {
        let mut x = w.begin_expert(3, e).expect("begin");
        for (k, role) in [Role::Gate, Role::Up, Role::Down].into_iter().enumerate() {
            let mut s = t(&format!("e{e}.{}", role.name()), vec![4, 1000]);
            s.source.as_mut().expect("src").shape = vec![2, 4, 1000];
            let byte = (e * 3 + k as u32) as u8 + 1;
            x.projection(role, &s, &mut &vec![byte; 8000][..])
                .expect("proj");
        }
        w = x.end_expert().expect("end");
    }
    w.finish().expect("finish");
    std::fs::read(&path).expect("read back")
}

struct Parts {
    index_offset: usize,
    index_len: usize,
    region_count: usize,
    footer_at: usize,
}

fn parts(b: &[u8]) -> Parts {
    let footer_at = b.len() - FOOTER_LEN;
    let f = Footer::decode(&b[footer_at..]);
    Parts {
        index_offset: f.index_offset as usize,
        index_len: f.index_len as usize,
        region_count: f.region_count as usize,
        footer_at,
    }
}

fn region_at(b: &[u8], i: usize) -> usize {
    parts(b).index_offset + i * REGION_RECORD_LEN
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Recompute header hash, index hashes and footer hash after a deliberate edit.
fn reseal(b: &mut [u8]) {
    let h = blake3::hash(&b[..48]);
    b[48..80].copy_from_slice(h.as_bytes());
    let p = parts(b);
    if let Some(index) = b.get(p.index_offset..p.index_offset + p.index_len) {
        let b3 = *blake3::hash(index).as_bytes();
        let sha: [u8; 32] = sha2::Sha256::digest(index).into();
        b[p.footer_at + 40..p.footer_at + 72].copy_from_slice(&b3);
        b[p.footer_at + 72..p.footer_at + 104].copy_from_slice(&sha);
    }
    let fh = Footer::hash_with(&b[..4096], &b[p.footer_at..]);
    b[p.footer_at + 128..p.footer_at + 160].copy_from_slice(&fh);
}

/// Open `b` with [`JnfReader::open`], and hold [`tarfa_format::reader::scan_index`] (the same
/// checks in one pass that keeps no region record, a path of its own through the index check) to
/// the same outcome: the same violation, or the same header, footer, root, strings and records.
fn open_bytes(b: &[u8]) -> Result<JnfReader, Error> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.jnf");
    std::fs::write(&path, b).expect("write");
    let opened = JnfReader::open(&path);
    let mut seen = Vec::new();
    let scanned = tarfa_format::reader::scan_index(&path, &mut |i, rec, _| {
        seen.push((i, rec.clone()));
    });
    match (&opened, &scanned) {
        (Ok(r), Ok(s)) => {
            assert_eq!(
                (r.header(), r.footer(), r.root()),
                (&s.header, &s.footer, &s.root)
            );
            assert_eq!(r.index().strings, s.strings);
            let want: Vec<_> = (0u32..).zip(r.regions().iter().cloned()).collect();
            assert_eq!(want, seen, "scan_index visits every region record in order");
        }
        (Err(a), Err(b)) => assert_eq!(
            a.violation(),
            b.violation(),
            "scan_index refuses as open does: {a} / {b}"
        ),
        (a, b) => panic!(
            "open and scan_index disagree: {:?} / {:?}",
            a.as_ref().err(),
            b.as_ref().err()
        ),
    }
    opened
}

fn violation_of(b: &[u8]) -> Violation {
    match open_bytes(b) {
        Ok(_) => panic!("damaged file was accepted"),
        Err(Error::Format { violation, .. }) => violation,
        Err(e) => panic!("expected a format violation, got {e}"),
    }
}

fn data_violation_of(b: &[u8]) -> Violation {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.jnf");
    std::fs::write(&path, b).expect("write");
    let r = JnfReader::open(&path).expect("structure is intact");
    match r.verify_data() {
        Ok(()) => panic!("damaged data was accepted"),
        Err(Error::Format { violation, .. }) => violation,
        Err(e) => panic!("expected a format violation, got {e}"),
    }
}

#[test]
fn the_valid_file_is_accepted_and_verifies() {
    let b = valid_file();
    let r = open_bytes(&b).expect("valid");
    r.verify_data().expect("verifies");
    assert_eq!(b.len() % 4096, 0);
}

#[test]
fn resealing_an_untouched_file_changes_nothing() {
    let b = valid_file();
    let mut c = b.clone();
    reseal(&mut c);
    assert_eq!(
        b, c,
        "the test helper must not mask damage it did not cause"
    );
}

#[test]
fn file_shorter_than_a_page_is_refused() {
    let b = valid_file();
    assert_eq!(
        violation_of(&b[..100]),
        Violation::FileTooShort { len: 100 }
    );
    assert_eq!(violation_of(&[]), Violation::FileTooShort { len: 0 });
}

#[test]
fn truncated_file_has_no_footer() {
    let b = valid_file();
    let n = b.len() - 4096;
    assert_eq!(violation_of(&b[..n]), Violation::NoFooter { len: n as u64 });
    let odd = b.len() - 1;
    assert_eq!(
        violation_of(&b[..odd]),
        Violation::NoFooter { len: odd as u64 }
    );
}

#[test]
fn appended_bytes_leave_no_footer_at_the_end() {
    let mut b = valid_file();
    b.extend_from_slice(&[0u8; 4096]);
    assert!(matches!(violation_of(&b), Violation::NoFooter { .. }));
}

#[test]
fn bad_magic_is_refused() {
    let mut b = valid_file();
    b[1] = b'X';
    assert!(matches!(violation_of(&b), Violation::BadMagic { .. }));
}

#[test]
fn unknown_major_version_is_refused() {
    let mut b = valid_file();
    b[8] = 2;
    reseal(&mut b);
    assert_eq!(violation_of(&b), Violation::UnsupportedMajor { major: 2 });
}

#[test]
fn changed_header_byte_fails_the_header_hash() {
    let mut b = valid_file();
    b[36] ^= 1; // layer_count
    assert_eq!(violation_of(&b), Violation::HeaderHashMismatch);
}

#[test]
fn unknown_must_understand_flag_is_refused() {
    let mut b = valid_file();
    b[16 + 5] = 0x10;
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::UnknownRequiredFlags { flags: 0x10 << 40 }
    );
}

#[test]
fn unknown_optional_flag_is_ignored() {
    let mut b = valid_file();
    b[24] = 0x80;
    reseal(&mut b);
    open_bytes(&b).expect("optional flags may be ignored");
}

#[test]
fn non_zero_reserved_header_byte_is_refused() {
    let mut b = valid_file();
    b[2000] = 1;
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::NonZeroReserved {
            offset: 2000,
            value: 1
        }
    );
}

#[test]
fn reserved_page_bytes_are_ignored_by_a_later_minor_version() {
    let mut b = valid_file();
    b[10] = 1; // minor 1
    b[2000] = 1;
    reseal(&mut b);
    open_bytes(&b).expect("a 1.1 field in the reserved area is ignorable");
}

#[test]
fn changed_footer_fails_the_footer_hash() {
    let mut b = valid_file();
    let p = parts(&b);
    b[p.footer_at + 33] ^= 1;
    assert_eq!(violation_of(&b), Violation::FooterHashMismatch);
}

#[test]
fn header_of_another_file_fails_the_footer_hash() {
    let mut b = valid_file();
    b[32] = 4; // layer_first 3 -> 4, header hash recomputed, footer not
    let h = blake3::hash(&b[..48]);
    b[48..80].copy_from_slice(h.as_bytes());
    assert_eq!(violation_of(&b), Violation::FooterHashMismatch);
}

#[test]
fn footer_file_length_must_match_the_file() {
    let mut b = valid_file();
    let p = parts(&b);
    let len = b.len() as u64;
    put_u64(&mut b, p.footer_at + 8, len + 4096);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::FileLenMismatch {
            expected: len + 4096,
            actual: len
        }
    );
}

#[test]
fn misaligned_index_offset_is_refused() {
    let mut b = valid_file();
    let p = parts(&b);
    put_u64(&mut b, p.footer_at + 16, p.index_offset as u64 + 8);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::Misaligned {
            what: Aligned::IndexOffset,
            value: p.index_offset as u64 + 8
        }
    );
}

#[test]
fn index_not_ending_before_the_footer_page_is_refused() {
    let mut b = valid_file();
    let p = parts(&b);
    let len = b.len() as u64;
    put_u64(&mut b, p.footer_at + 24, len);
    reseal(&mut b);
    assert!(matches!(violation_of(&b), Violation::IndexPlacement { .. }));
}

#[test]
fn region_count_larger_than_the_index_could_hold_is_refused_before_allocating() {
    let mut b = valid_file();
    let p = parts(&b);
    put_u32(&mut b, p.footer_at + 32, 4_000_000);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::LimitExceeded {
            what: "bytes of index records",
            ..
        }
    ));
    put_u32(&mut b, p.footer_at + 32, u32::MAX);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::LimitExceeded {
            what: "region count",
            ..
        }
    ));
}

#[test]
fn expert_count_must_equal_the_grid() {
    let mut b = valid_file();
    let p = parts(&b);
    put_u32(&mut b, p.footer_at + 36, 1);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::BadExpert {
            record: u32::MAX,
            layer: 3,
            expert: u32::MAX,
            fault: EF::CountNotGrid {
                expert_count: 1,
                layer_count: 1,
                experts_per_layer: 2
            }
        }
    );
}

#[test]
fn tampered_index_fails_the_index_hash() {
    let mut b = valid_file();
    let at = region_at(&b, 0) + 8;
    b[at] ^= 1;
    assert!(matches!(
        violation_of(&b),
        Violation::IndexHashMismatch { algo: "blake3", .. }
    ));
}

#[test]
fn misaligned_region_offset_is_refused() {
    let mut b = valid_file();
    let at = region_at(&b, 1);
    let off = get_u64(&b, at);
    put_u64(&mut b, at, off + 512);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::Misaligned {
            what: Aligned::RegionOffset {
                region: 1,
                name: "router".into()
            },
            value: off + 512
        }
    );
}

#[test]
fn overlapping_regions_are_refused() {
    let mut b = valid_file();
    let first = get_u64(&b, region_at(&b, 0));
    let at = region_at(&b, 1);
    put_u64(&mut b, at, first);
    reseal(&mut b);
    let v = violation_of(&b);
    assert!(
        matches!(v, Violation::RegionPlacement { region: 1, offset, expected, .. } if offset < expected),
        "{v}"
    );
    assert!(v.to_string().contains("overlap"));
}

#[test]
fn hole_between_regions_is_refused() {
    let mut b = valid_file();
    let at = region_at(&b, 2);
    let off = get_u64(&b, at);
    put_u64(&mut b, at, off + 4096);
    reseal(&mut b);
    let v = violation_of(&b);
    assert!(
        matches!(v, Violation::RegionPlacement { region: 2, offset, expected, .. } if offset > expected),
        "{v}"
    );
}

#[test]
fn region_reaching_past_the_data_area_is_refused() {
    let mut b = valid_file();
    let p = parts(&b);
    let last = p.region_count - 1;
    let at = region_at(&b, last) + 8;
    put_u64(&mut b, at, 1 << 40);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::RegionOutOfFile { len, .. } if len == 1 << 40
    ));
}

#[test]
fn unknown_dtype_is_refused() {
    let mut b = valid_file();
    let at = region_at(&b, 0) + 16;
    put_u32(&mut b, at, 4); // retired ggml Q4_2
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::UnknownDtype { region: 0, code: 4 }
    );
}

#[test]
fn length_disagreeing_with_dtype_and_shape_is_refused() {
    let mut b = valid_file();
    let at = region_at(&b, 0) + 24;
    put_u64(&mut b, at, 99); // shape [99] BF16 = 198 bytes, region is 200
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadShape {
            region: 0,
            fault: ShapeFault::LengthMismatch {
                dtype: Dtype::BF16,
                bytes: 198,
                length: 200,
                ..
            },
            ..
        }
    ));
}

#[test]
fn rank_over_eight_is_refused() {
    let mut b = valid_file();
    let at = region_at(&b, 0) + 20;
    put_u32(&mut b, at, 9);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadShape {
            region: 0,
            fault: ShapeFault::RankOverLimit { rank: 9 },
            ..
        }
    ));
}

#[test]
fn a_duplicate_name_far_from_its_first_names_the_first() {
    // Region 3 (e0.up) takes region 0's name: the first holder is found again by the reader and,
    // reading back records, by scan_index.
    let mut b = valid_file();
    let (r0, r3) = (region_at(&b, 0), region_at(&b, 3));
    let name0 = b[r0 + 100..r0 + 108].to_vec();
    b[r3 + 100..r3 + 108].copy_from_slice(&name0);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::DuplicateName {
            name: "norm".into(),
            first: 0,
            second: 3
        }
    );
}

#[test]
fn duplicate_region_names_are_refused() {
    let mut b = valid_file();
    let (r0, r1) = (region_at(&b, 0), region_at(&b, 1));
    let name0 = b[r0 + 100..r0 + 108].to_vec();
    b[r1 + 100..r1 + 108].copy_from_slice(&name0);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::DuplicateName {
            name: "norm".into(),
            first: 0,
            second: 1
        }
    );
}

#[test]
fn bad_utf8_in_a_name_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    let p = parts(&b);
    let name_off = u32::from_le_bytes(b[r0 + 100..r0 + 104].try_into().expect("4")) as usize;
    let table = p.index_offset + p.region_count * REGION_RECORD_LEN + 2 * 96;
    b[table + name_off] = 0xFF;
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadUtf8 {
            region: 0,
            field: "name",
            ..
        }
    ));
}

#[test]
fn string_reference_outside_the_table_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u32(&mut b, r0 + 100, u32::MAX - 2);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::StringOutOfBounds { region: 0, .. }
    ));
}

#[test]
fn empty_region_name_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u32(&mut b, r0 + 104, 0);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::BadName {
            region: 0,
            fault: NameFault::Empty
        }
    );
}

#[test]
fn non_zero_reserved_record_bytes_are_refused() {
    let mut b = valid_file();
    let r1 = region_at(&b, 1);
    b[r1 + 283] = 5;
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::NonZeroReserved {
            offset: (r1 + 283) as u64,
            value: 5
        }
    );
}

#[test]
fn plain_tensor_naming_an_expert_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u32(&mut b, r0 + 92, 0);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadRegionRole {
            region: 0,
            fault: RoleFault::TensorNamesExpert { expert: 0 },
            ..
        }
    ));
}

#[test]
fn layer_outside_the_file_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u32(&mut b, r0 + 88, 7);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadRegionRole {
            region: 0,
            fault: RoleFault::LayerOutsideFile {
                layer: 7,
                first: 3,
                end: 4
            },
            ..
        }
    ));
}

#[test]
fn source_range_of_the_wrong_length_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u64(&mut b, r0 + 144, 100 + 199);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadProvenance {
            region: 0,
            fault: PF::RangeLength {
                begin: 100,
                end: 299,
                length: 200
            },
            ..
        }
    ));
}

#[test]
fn source_dtype_differing_from_the_stored_dtype_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    put_u32(&mut b, r0 + 124, Dtype::F16.code());
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadProvenance {
            region: 0,
            fault: PF::DtypeDiffers { src_dtype, dtype },
            ..
        } if src_dtype == Dtype::F16.code() && dtype == Dtype::BF16.code()
    ));
}

#[test]
fn string_table_bytes_that_no_record_references_are_refused() {
    let mut b = valid_file();
    let p = parts(&b);
    // One more byte at the end of the index, inside the same page: the string table grows.
    put_u64(&mut b, p.footer_at + 24, p.index_len as u64 + 1);
    b[p.index_offset + p.index_len] = b'x';
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::NonCanonicalStrings {
            field: "string table",
            len: 1,
            fault: StringFault::Unreferenced,
            ..
        }
    ));
}

#[test]
fn a_repeated_string_stored_twice_is_refused() {
    let mut b = valid_file();
    // Region 0's source tensor is "norm", the same as its name: it must reuse the name's bytes.
    let r0 = region_at(&b, 0);
    let name_off = u32::from_le_bytes(b[r0 + 100..r0 + 104].try_into().expect("4"));
    let tensor_off = u32::from_le_bytes(b[r0 + 116..r0 + 120].try_into().expect("4"));
    assert_eq!(
        name_off, tensor_off,
        "the writer stores a repeated string once"
    );
    put_u32(&mut b, r0 + 116, name_off + 1);
    put_u32(&mut b, r0 + 120, 3); // "orm": a new string, but not where a new one must start
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::NonCanonicalStrings {
            region: 0,
            field: "source tensor",
            fault: StringFault::OutOfOrder { .. },
            ..
        }
    ));
}

#[test]
fn a_file_of_no_layers_must_not_name_a_first_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jnf");
    JnfWriter::create(&path, FileLayout::trunk())
        .expect("create")
        .finish()
        .expect("finish");
    let mut b = std::fs::read(&path).expect("read");
    put_u32(&mut b, 32, 9);
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::EmptyFileLayerFields {
            layer_first: 9,
            experts_per_layer: 0
        }
    );
}

#[test]
fn an_expert_of_biases_only_is_refused() {
    let mut b = valid_file();
    // Expert 1's regions are 5 (gate), 6 (up), 7 (down): make them biases.
    for (i, role) in [(5, Role::GateBias), (6, Role::UpBias), (7, Role::DownBias)] {
        let at = region_at(&b, i) + 96;
        put_u32(&mut b, at, role.code());
    }
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadExpert {
            record: 1,
            fault: EF::NoWeight,
            ..
        }
    ));
}

fn expert_at(b: &[u8], k: usize) -> usize {
    let p = parts(b);
    p.index_offset + p.region_count * REGION_RECORD_LEN + k * 96
}

#[test]
fn expert_records_out_of_grid_order_are_refused() {
    let mut b = valid_file();
    let (e0, e1) = (expert_at(&b, 0), expert_at(&b, 1));
    let rec0 = b[e0..e0 + 96].to_vec();
    let rec1 = b[e1..e1 + 96].to_vec();
    b[e0..e0 + 96].copy_from_slice(&rec1);
    b[e1..e1 + 96].copy_from_slice(&rec0);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadExpert {
            record: 0,
            layer: 3,
            expert: 1,
            fault: EF::GridOrder {
                layer: 3,
                expert: 0
            }
        }
    ));
}

#[test]
fn expert_extent_not_matching_its_regions_is_refused() {
    let mut b = valid_file();
    let e0 = expert_at(&b, 0);
    let len = get_u64(&b, e0 + 24);
    put_u64(&mut b, e0 + 24, len + 4096);
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadExpert {
            record: 0,
            fault: EF::ExtentMismatch { len: l, expected_len, .. },
            ..
        } if l == len + 4096 && expected_len == len
    ));
}

#[test]
fn expert_regions_in_the_wrong_role_order_are_refused() {
    let mut b = valid_file();
    // Swap the role codes of gate (region 2) and up (region 3).
    let (g, u) = (region_at(&b, 2) + 96, region_at(&b, 3) + 96);
    put_u32(&mut b, g, Role::Up.code());
    put_u32(&mut b, u, Role::Gate.code());
    reseal(&mut b);
    assert!(matches!(
        violation_of(&b),
        Violation::BadExpert {
            record: 0,
            fault: EF::RolesNotIncreasing {
                region: 3,
                role: 2,
                previous: 3
            },
            ..
        }
    ));
}

#[test]
fn expert_digest_not_matching_its_region_hashes_is_refused() {
    let mut b = valid_file();
    let e1 = expert_at(&b, 1);
    b[e1 + 64] ^= 0xFF;
    reseal(&mut b);
    assert_eq!(
        violation_of(&b),
        Violation::ExpertDigestMismatch {
            layer: 3,
            expert: 1,
            algo: "blake3"
        }
    );
}

#[test]
fn changed_region_byte_fails_the_region_hash() {
    let mut b = valid_file();
    // Last byte of layer 3 expert 1's down projection: the last region of the file.
    let p = parts(&b);
    let last = region_at(&b, p.region_count - 1);
    let end = (get_u64(&b, last) + get_u64(&b, last + 8)) as usize;
    b[end - 1] ^= 0x01;
    let v = data_violation_of(&b);
    assert!(
        matches!(&v, Violation::RegionHashMismatch { region, name, location, .. }
            if *region == 7 && name == "e1.down" && location == "layer 3 expert 1 down"),
        "{v}"
    );
}

#[test]
fn non_zero_padding_after_a_region_is_refused() {
    let mut b = valid_file();
    let r0 = region_at(&b, 0);
    let end = get_u64(&b, r0) + get_u64(&b, r0 + 8);
    b[end as usize + 10] = 0xAB;
    assert_eq!(
        data_violation_of(&b),
        Violation::NonZeroPadding {
            offset: end + 10,
            value: 0xAB,
            after: PaddingAfter::Region {
                region: 0,
                name: "norm".into()
            }
        }
    );
}

#[test]
fn non_zero_padding_after_the_index_is_refused() {
    let mut b = valid_file();
    let p = parts(&b);
    let at = p.index_offset + p.index_len + 3;
    b[at] = 1;
    assert!(matches!(
        data_violation_of(&b),
        Violation::NonZeroPadding { offset, after: PaddingAfter::Index, .. } if offset == at as u64
    ));
}

/// The violation a valid file damaged by `f` (then resealed) gets.
fn damaged(f: impl FnOnce(&mut Vec<u8>)) -> Violation {
    let mut b = valid_file();
    f(&mut b);
    reseal(&mut b);
    violation_of(&b)
}

fn table_at(b: &[u8]) -> usize {
    let p = parts(b);
    p.index_offset + p.region_count * REGION_RECORD_LEN + 2 * 96
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[test]
fn each_shape_rule_has_its_own_fault() {
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u64(b, r0 + 32, 5); // shape[1] of a rank-1 region
    });
    assert!(
        matches!(
            &v,
            Violation::BadShape {
                region: 0,
                fault: ShapeFault::DimsPastRank,
                ..
            }
        ),
        "{v}"
    );
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u32(b, r0 + 16, Dtype::Q8_0.code()); // [100]: not whole blocks of 32
    });
    assert!(
        matches!(
            &v,
            Violation::BadShape {
                region: 0,
                fault: ShapeFault::PartialBlock {
                    block_elems: 32,
                    ..
                },
                ..
            }
        ),
        "{v}"
    );
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u32(b, r0 + 20, 2);
        put_u64(b, r0 + 24, 1 << 63);
        put_u64(b, r0 + 32, 4);
    });
    assert!(
        matches!(
            &v,
            Violation::BadShape {
                region: 0,
                fault: ShapeFault::LengthOverflow { .. },
                ..
            }
        ),
        "{v}"
    );
}

#[test]
fn each_role_rule_has_its_own_fault() {
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u32(b, r0 + 96, 99);
    });
    assert!(
        matches!(
            &v,
            Violation::BadRegionRole {
                region: 0,
                fault: RoleFault::UnknownRole { code: 99 },
                ..
            }
        ),
        "{v}"
    );
    let v = damaged(|b| {
        let r2 = region_at(b, 2);
        put_u32(b, r2 + 92, 5);
    });
    assert!(
        matches!(
            &v,
            Violation::BadRegionRole {
                region: 2,
                fault: RoleFault::ProjectionOutsideGrid {
                    layer: 3,
                    expert: 5,
                    experts_per_layer: 2
                },
                ..
            }
        ),
        "{v}"
    );
    // A gate projection of layer 3 expert 0 that expert 0's record does not list.
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u32(b, r0 + 92, 0);
        put_u32(b, r0 + 96, Role::Gate.code());
    });
    assert!(
        matches!(
            &v,
            Violation::BadRegionRole {
                region: 0,
                fault: RoleFault::Unlisted,
                ..
            }
        ),
        "{v}"
    );
}

#[test]
fn each_provenance_rule_has_its_own_fault() {
    let prov = |f: fn(&mut Vec<u8>)| match damaged(f) {
        Violation::BadProvenance { fault, .. } => fault,
        v => panic!("expected BadProvenance, got {v}"),
    };
    assert_eq!(
        prov(|b| {
            let r0 = region_at(b, 0);
            put_u32(b, r0 + 128, 9);
        }),
        PF::SourceRankOverLimit { src_ndim: 9 }
    );
    assert_eq!(
        prov(|b| {
            let r0 = region_at(b, 0);
            put_u64(b, r0 + 160, 1); // src_shape[1] of a rank-1 source
        }),
        PF::SourceDimsPastRank { src_ndim: 1 }
    );
    assert_eq!(
        prov(|b| {
            let r1 = region_at(b, 1); // router: no source
            put_u64(b, r1 + 136, 5);
        }),
        PF::FieldsWithoutFile
    );
    assert_eq!(
        prov(|b| {
            let r0 = region_at(b, 0);
            let at = table_at(b) + get_u32(b, r0 + 108) as usize;
            b[at] = b'/';
        }),
        PF::NotRelativePath {
            src_file: "/odel-00001-of-00002.safetensors".into(),
            fault: SourcePathFault::Absolute,
        }
    );
    assert_eq!(
        prov(|b| {
            let r0 = region_at(b, 0);
            put_u32(b, r0 + 116, 0);
            put_u32(b, r0 + 120, 0);
        }),
        PF::EmptyTensorName
    );
    assert_eq!(
        prov(|b| {
            let r0 = region_at(b, 0);
            put_u64(b, r0 + 152, 10); // [10] BF16 holds 20 of the 200 bytes
        }),
        PF::ShapeTooSmall {
            shape: vec![10],
            length: 200
        }
    );
}

#[test]
fn each_string_table_rule_has_its_own_fault() {
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        put_u32(b, r0 + 116, 5);
        put_u32(b, r0 + 120, 0);
    });
    assert!(
        matches!(
            &v,
            Violation::NonCanonicalStrings {
                region: 0,
                fault: StringFault::EmptyNotAtZero,
                ..
            }
        ),
        "{v}"
    );
    // Region 1's name becomes a second copy of "norm", stored where a new string starts.
    let v = damaged(|b| {
        let r1 = region_at(b, 1);
        let at = table_at(b) + get_u32(b, r1 + 100) as usize;
        b[at..at + 4].copy_from_slice(b"norm");
        put_u32(b, r1 + 104, 4);
    });
    assert!(
        matches!(
            &v,
            Violation::NonCanonicalStrings {
                region: 1,
                field: "name",
                fault: StringFault::RepeatNotShared { first: 0 },
                ..
            }
        ),
        "{v}"
    );
    let v = damaged(|b| {
        let r0 = region_at(b, 0);
        let at = table_at(b) + get_u32(b, r0 + 100) as usize;
        b[at + 1] = 0;
    });
    assert_eq!(
        v,
        Violation::BadName {
            region: 0,
            fault: NameFault::ContainsNul
        }
    );
}

#[test]
fn each_expert_record_rule_has_its_own_fault() {
    let fault = |f: fn(&mut Vec<u8>)| match damaged(f) {
        Violation::BadExpert { fault, .. } => fault,
        v => panic!("expected BadExpert, got {v}"),
    };
    assert_eq!(
        fault(|b| {
            let e0 = expert_at(b, 0);
            put_u32(b, e0 + 12, 0);
        }),
        EF::RegionCount { count: 0 }
    );
    assert_eq!(
        fault(|b| {
            let e1 = expert_at(b, 1);
            put_u32(b, e1 + 12, 8);
        }),
        EF::RegionsPastEnd {
            first: 5,
            end: 13,
            regions: 8
        }
    );
    assert_eq!(
        fault(|b| {
            let e1 = expert_at(b, 1);
            put_u32(b, e1 + 8, 4);
        }),
        EF::RegionShared { region: 4 }
    );
    assert_eq!(
        fault(|b| {
            let r5 = region_at(b, 5);
            put_u32(b, r5 + 92, 0);
        }),
        EF::NotItsProjection {
            region: 5,
            layer: 3,
            expert: 0,
            role: Role::Gate.code()
        }
    );
    assert_eq!(
        fault(|b| {
            let r2 = region_at(b, 2);
            put_u32(b, r2 + 96, Role::GateUp.code());
        }),
        EF::FusedBesideSplit
    );
    assert_eq!(
        fault(|b| {
            let (r3, r4) = (region_at(b, 3), region_at(b, 4));
            put_u32(b, r3 + 96, Role::GateUpBias.code());
            put_u32(b, r4 + 96, Role::GateBias.code());
        }),
        EF::FusedBiasBesideSplit
    );
    // Expert 0's projections are stored after expert 1's: each record checks out, their order
    // in the file does not.
    assert_eq!(
        fault(|b| {
            let (e0, e1) = (expert_at(b, 0), expert_at(b, 1));
            let rec0 = b[e0 + 8..e0 + 96].to_vec();
            let rec1 = b[e1 + 8..e1 + 96].to_vec();
            b[e0 + 8..e0 + 96].copy_from_slice(&rec1);
            b[e1 + 8..e1 + 96].copy_from_slice(&rec0);
            for i in 2..8 {
                let r = region_at(b, i);
                put_u32(b, r + 92, u32::from(i < 5));
            }
        }),
        EF::ExtentsOutOfOrder
    );
}

// The writer refuses what the reader would refuse, before writing a byte.

fn writer_error(f: impl FnOnce(&Path) -> Result<(), Error>) -> Error {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("w.jnf");
    let e = f(&path).expect_err("writer must refuse");
    assert!(!path.exists(), "nothing published");
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").collect();
    assert!(left.is_empty(), "no temporary file left behind");
    e
}

/// The contract a writer error says was broken.
fn usage_fault(e: Error) -> UsageFault {
    match e {
        Error::Usage { fault, .. } => fault,
        e => panic!("expected a writer usage error, got {e}"),
    }
}

fn bf16(name: &str, shape: Vec<u64>) -> RegionSpec {
    RegionSpec {
        name: name.into(),
        dtype: Dtype::BF16,
        shape,
        layer: None,
        source: None,
    }
}

#[test]
fn writer_refuses_duplicate_names() {
    let msg = writer_error(|p| {
        let mut w = JnfWriter::create(p, FileLayout::trunk())?;
        w.tensor(&bf16("a", vec![1]), &mut &[0u8; 2][..])?;
        w.tensor(&bf16("a", vec![1]), &mut &[0u8; 2][..])?;
        w.finish().map(drop)
    });
    assert_eq!(
        usage_fault(msg),
        UsageFault::DuplicateName { name: "a".into() }
    );
}

#[test]
fn writer_refuses_a_short_source() {
    let msg = writer_error(|p| {
        let mut w = JnfWriter::create(p, FileLayout::trunk())?;
        w.tensor(&bf16("a", vec![10]), &mut &[0u8; 19][..])?;
        w.finish().map(drop)
    });
    assert!(
        msg.to_string()
            .contains("source ended after 19 of 20 bytes"),
        "{msg}"
    );
    assert_eq!(
        usage_fault(msg),
        UsageFault::SourceShort {
            name: "a".into(),
            got: 19,
            length: 20
        }
    );
}

#[test]
fn writer_refuses_experts_out_of_grid_order_and_an_incomplete_grid() {
    let msg = writer_error(|p| {
        let w = JnfWriter::create(p, FileLayout::layer(0, 2))?;
        w.begin_expert(0, 1).map(drop)
    });
    assert_eq!(
        usage_fault(msg),
        UsageFault::ExpertOutOfOrder {
            layer: 0,
            expert: 1,
            next_layer: 0,
            next_expert: 0
        }
    );
    let msg = writer_error(|p| {
        let w = JnfWriter::create(p, FileLayout::layer(0, 2))?;
        let mut x = w.begin_expert(0, 0)?;
        x.projection(Role::Down, &bf16("d", vec![2]), &mut &[0u8; 4][..])?;
        x.end_expert()?.finish().map(drop)
    });
    assert_eq!(
        usage_fault(msg),
        UsageFault::IncompleteGrid {
            written: 1,
            total: 2
        }
    );
}

#[test]
fn writer_refuses_roles_out_of_order_and_fused_beside_split() {
    let msg = writer_error(|p| {
        let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
        let mut x = w.begin_expert(0, 0)?;
        x.projection(Role::Down, &bf16("d", vec![2]), &mut &[0u8; 4][..])?;
        x.projection(Role::Gate, &bf16("g", vec![2]), &mut &[0u8; 4][..])?;
        x.end_expert()?.finish().map(drop)
    });
    assert_eq!(
        usage_fault(msg),
        UsageFault::RoleOrder {
            role: Role::Gate,
            last_role: Role::Down.code()
        }
    );
    let msg = writer_error(|p| {
        let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
        let mut x = w.begin_expert(0, 0)?;
        x.projection(Role::GateUp, &bf16("gu", vec![2]), &mut &[0u8; 4][..])?;
        x.projection(Role::Up, &bf16("u", vec![2]), &mut &[0u8; 4][..])?;
        x.end_expert()?.finish().map(drop)
    });
    assert_eq!(usage_fault(msg), UsageFault::FusedBesideSplit);
}

#[test]
fn writer_refuses_a_shape_that_is_not_whole_blocks() {
    let msg = writer_error(|p| {
        let mut w = JnfWriter::create(p, FileLayout::trunk())?;
        let s = RegionSpec {
            dtype: Dtype::Q8_0,
            ..bf16("q", vec![2, 31])
        };
        w.tensor(&s, &mut &[0u8; 100][..])?;
        w.finish().map(drop)
    });
    assert!(
        matches!(usage_fault(msg), UsageFault::NoByteLength { name, dtype: Dtype::Q8_0, .. } if name == "q")
    );
}

#[test]
fn writer_refuses_a_provenance_path_that_escapes_the_source_directory() {
    let msg = writer_error(|p| {
        let mut w = JnfWriter::create(p, FileLayout::trunk())?;
        let s = RegionSpec {
            source: Some(Provenance {
                file: "../etc/passwd".into(),
                tensor: "t".into(),
                begin: 0,
                shape: vec![1],
            }),
            ..bf16("a", vec![1])
        };
        w.tensor(&s, &mut &[0u8; 2][..])?;
        w.finish().map(drop)
    });
    assert!(matches!(
        msg.violation(),
        Some(Violation::BadProvenance {
            fault: PF::NotRelativePath { src_file, fault: SourcePathFault::DotComponent },
            ..
        }) if src_file == "../etc/passwd"
    ));
}

#[test]
fn writer_refuses_each_misuse_with_its_own_fault() {
    let fault = |f: fn(&Path) -> Result<(), Error>| usage_fault(writer_error(f));
    assert_eq!(
        fault(|p| {
            let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
            let x = w.begin_expert(0, 0)?;
            x.end_expert()?.finish().map(drop)
        }),
        UsageFault::NoProjections {
            layer: 0,
            expert: 0
        }
    );
    assert_eq!(
        fault(|p| {
            let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
            let mut x = w.begin_expert(0, 0)?;
            x.projection(Role::Tensor, &bf16("t", vec![2]), &mut &[0u8; 4][..])?;
            x.end_expert()?.finish().map(drop)
        }),
        UsageFault::TensorRoleInExpert
    );
    assert_eq!(
        fault(|p| {
            let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
            let mut x = w.begin_expert(0, 0)?;
            let s = RegionSpec {
                layer: Some(5),
                ..bf16("g", vec![2])
            };
            x.projection(Role::Gate, &s, &mut &[0u8; 4][..])?;
            x.end_expert()?.finish().map(drop)
        }),
        UsageFault::ProjectionLayer {
            name: "g".into(),
            spec_layer: 5,
            layer: 0
        }
    );
    assert_eq!(
        fault(|p| {
            let w = JnfWriter::create(p, FileLayout::layer(0, 1))?;
            let x = w.begin_expert(0, 0)?;
            let mut x = x;
            x.projection(Role::Down, &bf16("d", vec![2]), &mut &[0u8; 4][..])?;
            x.end_expert()?.begin_expert(0, 1).map(drop)
        }),
        UsageFault::ExpertOutsideGrid {
            layer: 0,
            expert: 1
        }
    );
    assert_eq!(
        fault(|p| {
            let mut w = JnfWriter::create(p, FileLayout::trunk())?;
            w.tensor(&bf16("r", vec![1; 9]), &mut &[0u8; 2][..])?;
            w.finish().map(drop)
        }),
        UsageFault::RankOverLimit {
            name: "r".into(),
            rank: 9
        }
    );
    assert_eq!(
        fault(|p| {
            let mut w = JnfWriter::create(p, FileLayout::trunk())?;
            let s = RegionSpec {
                source: Some(Provenance {
                    file: "m.safetensors".into(),
                    tensor: "t".into(),
                    begin: 0,
                    shape: vec![1; 9],
                }),
                ..bf16("s", vec![1])
            };
            w.tensor(&s, &mut &[0u8; 2][..])?;
            w.finish().map(drop)
        }),
        UsageFault::SourceRankOverLimit {
            name: "s".into(),
            rank: 9
        }
    );
    assert_eq!(
        fault(|p| {
            let mut w = JnfWriter::create(p, FileLayout::trunk())?;
            w.tensor(&bf16(&"n".repeat(4097), vec![1]), &mut &[0u8; 2][..])?;
            w.finish().map(drop)
        }),
        UsageFault::StringTooLong { len: 4097 }
    );
    assert_eq!(
        fault(|p| {
            let mut w = JnfWriter::create(p, FileLayout::trunk())?;
            w.tensor(&bf16("", vec![1]), &mut &[0u8; 2][..])?;
            w.finish().map(drop)
        }),
        UsageFault::EmptyName
    );
    assert_eq!(
        fault(|p| {
            let mut w = JnfWriter::create(p, FileLayout::trunk())?;
            w.tensor(&bf16("a\0b", vec![1]), &mut &[0u8; 2][..])?;
            w.finish().map(drop)
        }),
        UsageFault::NameWithNul {
            name: "a\0b".into()
        }
    );
}
