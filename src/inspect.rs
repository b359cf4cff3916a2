//! `tarfa inspect`: print a [`tarfa_format::summary`] for people, or as JSON.

use std::fmt::Write as _;

use indicatif::HumanBytes;
use tarfa_format::summary::{self, FileSummary, ModelSummary};

use crate::cli::InspectArgs;
use crate::diagnose::{
    is_jnf_file, is_safetensors_file, reads_a_model_dir, require_model_dir, Refused,
};

/// What inspect found; `Ok(false)` when a model directory disagrees with its manifest.
pub fn run(args: &InspectArgs) -> anyhow::Result<bool> {
    if crate::inspect_gguf::is_gguf(&args.path) {
        return crate::inspect_gguf::run(args);
    }
    if args.path.is_dir() {
        require_model_dir(&args.path, "inspect", || {
            format!(
                "{}, a .jnf file or a .gguf file",
                reads_a_model_dir("inspect")
            )
        })?;
        let m = summary::summarize_model(&args.path)?;
        if args.json {
            crate::json::print(&crate::json::document("tarfa.inspect-model/1", &m)?)?;
        } else {
            print!("{}", render_model(&m, args.regions));
        }
        return Ok(m.mismatches.is_empty());
    }
    if is_safetensors_file(&args.path) {
        let p = args.path.display();
        let dir = args
            .path
            .parent()
            .map_or(".".into(), |d| d.display().to_string());
        return Err(Refused {
            code: 1,
            message: format!("{p}: a safetensors checkpoint file, not a JNF or GGUF file"),
            hint: format!(
                "inspect reads JNF files, JNF model directories and GGUF files: convert the checkpoint (tarfa convert {dir} -o MODEL_DIR), or list its tensors (tarfa fetch {p} --tensors '*' --list)"
            ),
        }
        .into());
    }
    // A file that is neither JNF nor GGUF (nor a checkpoint's, above) is not damaged JNF: it is
    // the wrong file.
    if args.path.is_file() && !is_jnf_file(&args.path) {
        return Err(Refused {
            code: 1,
            message: format!(
                "{}: neither a JNF file nor a GGUF file",
                args.path.display()
            ),
            hint: format!(
                "{}, a .jnf file or a .gguf file",
                reads_a_model_dir("inspect")
            ),
        }
        .into());
    }
    let f = summary::summarize_file(&args.path)?;
    if args.json {
        crate::json::print(&crate::json::document("tarfa.inspect-jnf/1", &f)?)?;
    } else {
        print!("{}", render_file(&f, true));
    }
    Ok(true)
}

fn layers_text(f: &FileSummary) -> String {
    match f.layer_count {
        0 => "trunk (no layers)".to_string(),
        1 => format!("layer {}", f.layer_first),
        n => format!("layers {} to {}", f.layer_first, f.layer_first + n - 1),
    }
}

/// The readable summary of one file.
pub fn render_file(f: &FileSummary, with_regions: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: JNF {}, {} ({} bytes), {}, {} experts/layer",
        f.path,
        f.version,
        HumanBytes(f.file_len),
        f.file_len,
        layers_text(f),
        f.experts_per_layer
    );
    let _ = writeln!(s, "  root sha256 {}", f.root_sha256);
    let _ = writeln!(s, "  root blake3 {}", f.root_blake3);
    let _ = writeln!(
        s,
        "  {} regions, {} experts, {} of data; index {} bytes at {}",
        f.regions.len(),
        f.experts.len(),
        HumanBytes(f.data_bytes),
        f.index_len,
        f.index_offset
    );
    let dtypes: Vec<String> = f
        .dtypes
        .iter()
        .map(|(d, t)| format!("{d} x{} ({})", t.regions, HumanBytes(t.bytes)))
        .collect();
    let _ = writeln!(s, "  dtypes: {}", dtypes.join(", "));
    if let (Some(first), Some(last)) = (f.experts.first(), f.experts.last()) {
        let sizes: Vec<u64> = f.experts.iter().map(|e| e.extent_len).collect();
        let _ = writeln!(
            s,
            "  experts: layer {} expert {} to layer {} expert {}, extents of {} to {} each",
            first.layer,
            first.expert,
            last.layer,
            last.expert,
            HumanBytes(sizes.iter().copied().min().unwrap_or(0)),
            HumanBytes(sizes.iter().copied().max().unwrap_or(0)),
        );
    }
    if with_regions {
        let _ = writeln!(
            s,
            "  {:>4} {:>12} {:>10} {:<6} {:<16} {:<14} {:<16} name / source",
            "#", "offset", "length", "dtype", "shape", "where", "sha256"
        );
        for r in &f.regions {
            let place = match (r.layer, r.expert) {
                (None, _) => "trunk".to_string(),
                (Some(l), None) => format!("L{l}"),
                (Some(l), Some(e)) => format!("L{l} E{e} {}", r.role),
            };
            let _ = writeln!(
                s,
                "  {:>4} {:>12} {:>10} {:<6} {:<16} {:<14} {:<16} {}",
                r.index,
                r.offset,
                r.length,
                r.dtype,
                format!("{:?}", r.shape),
                place,
                &r.sha256[..16],
                r.name
            );
            if let Some(src) = &r.source {
                let _ = writeln!(
                    s,
                    "  {:>85} <- {} '{}' bytes [{}, {}) of {:?}",
                    "", src.file, src.tensor, src.begin, src.end, src.shape
                );
            }
        }
    }
    s
}

/// The readable summary of a model directory.
pub fn render_model(m: &ModelSummary, with_regions: bool) -> String {
    let mut s = String::new();
    let a = &m.manifest.architecture;
    // config.json's `model_type`; a GGUF's key/values are kept typed, `{"type", "value"}`.
    let model_type = a
        .config
        .get("model_type")
        .and_then(|v| v.as_str())
        .or_else(|| {
            let arch = a.config.get("general.architecture")?;
            arch.get("value").unwrap_or(arch).as_str()
        })
        .unwrap_or("architecture not recorded");
    let _ = writeln!(
        s,
        "{}: JNF model {}.{}, {} ({}), {} of {} layers present",
        m.dir,
        m.manifest.format_version[0],
        m.manifest.format_version[1],
        model_type,
        a.source_format,
        m.manifest.layers.len(),
        a.num_layers
    );
    let c = &m.manifest.conversion;
    let _ = writeln!(
        s,
        "  converted by {} {} from {} source file(s)",
        c.tool,
        c.tool_version,
        c.sources.len()
    );
    let total: u64 = m.manifest.files.iter().map(|f| f.size).sum();
    let _ = writeln!(
        s,
        "  {} files, {} in all",
        m.manifest.files.len(),
        HumanBytes(total)
    );
    for f in &m.manifest.files {
        let kind = format!("{:?}", f.kind).to_lowercase();
        let _ = writeln!(
            s,
            "  {:<24} {:>10} {kind:<5} sha256 {}",
            f.path,
            HumanBytes(f.size).to_string(),
            f.sha256
        );
    }
    for f in &m.files {
        let _ = writeln!(s);
        s.push_str(&render_file(f, with_regions));
    }
    if m.mismatches.is_empty() {
        let _ = writeln!(s, "\nall files match the manifest's sizes and root digests");
    } else {
        for x in &m.mismatches {
            let _ = writeln!(s, "\nMISMATCH {x}");
        }
    }
    s
}
