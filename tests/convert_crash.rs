//! `tarfa convert` killed with SIGKILL at many points, resumed each time, ends byte-identical to
//! an uninterrupted conversion: same files, same bytes, no temporary file left.
//!
//! Kill points sweep the conversion: kill k waits for layer file k·L/11 to be published, then a
//! pseudo-random delay (splitmix64, seeded) within one layer's write time of the reference run,
//! so the kills land in the trunk, in each stretch of layers, around the manifest and in the
//! checks a resumed run makes of the layers already present. Waiting on progress rather than on
//! the clock alone keeps the sweep the same on a fast or a loaded machine: a resumed run spends a
//! growing share of its life re-checking earlier layers.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_format::manifest::{layer_file_name, Manifest, MANIFEST_NAME};
use tarfa_format::JnfReader;

/// Interrupted runs required before the final one.
const KILLS: usize = 12;
/// Give up after this many attempts (a run that finished before its kill is not a kill).
const MAX_ATTEMPTS: usize = 24;
const SEED: u64 = 0x7A4F_A00C_0FFE_E001;

/// Deterministic pseudo-random numbers for the kill delays.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn spawn_convert(src: &Path, out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .arg("convert")
        .arg(src)
        .arg("-o")
        .arg(out)
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tarfa convert")
}

fn convert_to_completion(src: &Path, out: &Path) {
    let o = spawn_convert(src, out)
        .wait_with_output()
        .expect("wait for tarfa convert");
    assert!(
        o.status.success(),
        "tarfa convert failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect()
}

fn count_layer_files(out: &Path) -> usize {
    std::fs::read_dir(out).map_or(0, |rd| {
        rd.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("layer-"))
        })
        .count()
    })
}

/// What a killed run may leave: published files are whole (they were renamed into place after
/// fsync), and a manifest, if there is one, lists only layer files that are there. Each
/// published file (name and inode: files are replaced only by rename) is hashed once, in `seen`.
/// Returns the number of layer files present.
fn assert_published_files_whole(out: &Path, seen: &mut BTreeSet<(String, u64)>) -> usize {
    let Ok(entries) = std::fs::read_dir(out) else {
        return 0; // killed before it made the directory
    };
    let mut layers = 0;
    for e in entries {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".jnf") {
            continue;
        }
        layers += usize::from(name.starts_with("layer-"));
        let ino = e.metadata().expect("stat").ino();
        if seen.insert((name.clone(), ino)) {
            let r = JnfReader::open(out.join(&name))
                .unwrap_or_else(|e| panic!("{name} is published but does not open: {e}"));
            r.verify_data()
                .unwrap_or_else(|e| panic!("{name} is published but not whole: {e}"));
        }
    }
    if out.join(MANIFEST_NAME).exists() {
        let m = Manifest::load(out).expect("a published manifest loads");
        for l in m.layers {
            assert!(
                out.join(layer_file_name(l)).exists(),
                "the manifest lists layer {l}, which is not there"
            );
        }
    }
    layers
}

#[test]
fn conversion_killed_at_many_points_and_resumed_is_byte_identical_to_an_uninterrupted_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let spec = SynthSpec {
        layers: 16,
        experts: 32,
        hidden: 512,
        inter: 256,
        vocab: 1024,
        fused: false,
        shards: 2,
        mtp: false,
    };
    write_checkpoint(&src, &spec).expect("write checkpoint");

    let reference = dir.path().join("reference");
    let t0 = Instant::now();
    convert_to_completion(&src, &reference);
    let full = t0.elapsed();
    let want = snapshot(&reference);
    let layers = spec.total_layers() as usize;
    let per_layer = full / spec.total_layers();

    let out = dir.path().join("killed");
    let mut rng = SEED;
    let mut seen = BTreeSet::new();
    let mut kills = Vec::new();
    let mut finished_before_kill = 0;
    for attempt in 0..MAX_ATTEMPTS {
        if kills.len() >= KILLS {
            break;
        }
        let present = count_layer_files(&out);
        let mut child = spawn_convert(&src, &out);
        // Kill k waits until layer file `target` is published (and at least one more than
        // were present: a resumed run first checks those), then a pseudo-random fraction of one
        // layer's write time: kill 0 lands in the trunk or layer 0, the last ones in the final
        // layers and the manifest; later attempts, on a complete directory, in its checks.
        let target = match attempt {
            0 => 0,
            k => (1 + (k - 1) * (layers - 1) / (KILLS - 2)).min(layers),
        };
        let wait_for = target.max(present + 1).min(layers);
        let waited = Instant::now();
        while attempt > 0
            && count_layer_files(&out) < wait_for
            && child.try_wait().expect("poll child").is_none()
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let jitter = (splitmix64(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
        std::thread::sleep(per_layer.mul_f64(jitter));
        let delay = waited.elapsed();
        match child.try_wait().expect("poll child") {
            Some(status) => {
                assert!(status.success(), "an uninterrupted resume failed: {status}");
                finished_before_kill += 1;
            }
            None => {
                child.kill().expect("SIGKILL");
                child.wait().expect("reap");
                let after = assert_published_files_whole(&out, &mut seen);
                let temps = std::fs::read_dir(&out).map_or(0, |rd| {
                    rd.filter(|e| {
                        e.as_ref()
                            .is_ok_and(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                    })
                    .count()
                });
                kills.push((delay.as_millis(), after, temps));
            }
        }
    }
    eprintln!(
        "reference run {:.2} s; {} kills (ms after spawn, layer files, temporary files left): {kills:?}; \
         {finished_before_kill} runs finished before their kill",
        full.as_secs_f64(),
        kills.len()
    );
    assert!(
        kills.len() >= KILLS,
        "only {} runs were killed",
        kills.len()
    );
    let states: BTreeSet<usize> = kills.iter().map(|k| k.1).collect();
    assert!(
        states.len() >= KILLS / 2,
        "the kills must land all along the conversion: {kills:?}"
    );
    assert!(
        kills.iter().any(|k| k.2 > 0),
        "some kill must land mid-file and leave a temporary file to clean up: {kills:?}"
    );

    convert_to_completion(&src, &out);
    let got = snapshot(&out);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "file sets differ (temporary files left, or files missing)"
    );
    for (name, bytes) in &want {
        assert!(&got[name] == bytes, "{name} differs from the reference");
    }
    assert!(want.contains_key(".tarfa-convert.lock"));
    assert!(want.contains_key(MANIFEST_NAME));
    assert_eq!(
        want.keys().filter(|n| n.starts_with('.')).count(),
        1,
        "only the lock file is hidden"
    );
}
