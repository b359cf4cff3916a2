//! NumPy `.npy` files (format version 1.0) of 2-D little-endian `f32`/`f64` arrays: what
//! `tarfa run --logits-out` writes and what the reference fixtures from transformers hold.

use std::path::Path;

use crate::error::{DecodeError, NpyFault, Result};

/// A 2-D array read from a `.npy` file, widened to `f64` (exact for `f32`).
#[derive(Clone, Debug, PartialEq)]
pub struct Array2 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row-major values.
    pub data: Vec<f64>,
    /// Whether the file held `f32` (else `f64`).
    pub is_f32: bool,
}

impl Array2 {
    /// Row `r`.
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// The bytes of a `.npy` file holding `rows` (all of one length) as `<f4`.
pub fn encode_f32(rows: &[Vec<f32>]) -> Vec<u8> {
    let cols = rows.first().map_or(0, |r| r.len());
    let mut out = header(rows.len(), cols);
    out.reserve(rows.len() * cols * 4);
    for r in rows {
        assert_eq!(r.len(), cols, "rows of one length");
        for v in r {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// A `.npy` file of `<f4` rows written as they come (`tarfa run --logits-out`), so a long run
/// never holds its logits in memory: a regular file (or a new one) is written under its
/// temporary name and its header's row count set when it is published ([`F32Writer::finish`]);
/// a character device or FIFO, which cannot seek, is opened at once (`open_stream`) and gets the
/// rows held and written, with their header, at the end.
/// The path is checked when the writer is made ([`tarfa_format::publish::output_kind`]: a
/// symbolic link or a directory is refused there, before any work). The bytes are
/// [`encode_f32`]'s: its header is 128 bytes for any shape a machine can hold.
#[derive(Debug)]
pub struct F32Writer {
    path: std::path::PathBuf,
    sink: Sink,
    cols: Option<usize>,
    rows: usize,
}

#[derive(Debug)]
enum Sink {
    File(std::io::BufWriter<tarfa_format::publish::PendingFile>),
    /// The device or FIFO, opened at once (a path that cannot be opened fails before the run),
    /// and the rows, written with their header at the end.
    Held(std::fs::File, Vec<Vec<f32>>),
}

/// The header [`encode_f32`] writes for `rows × cols` (128 bytes: magic, version, length, the
/// dict padded with spaces, '\n').
fn header(rows: usize, cols: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    let mut out = Vec::with_capacity(unpadded + pad);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out
}

impl F32Writer {
    /// Check `path` as an output and start the file.
    pub fn create(path: &Path) -> Result<F32Writer> {
        use std::io::Write;
        use tarfa_format::publish::{output_kind, OutputKind, PendingFile};
        let sink = match output_kind(path)? {
            OutputKind::Stream(_) => {
                Sink::Held(tarfa_format::publish::open_stream(path)?, Vec::new())
            }
            OutputKind::Replace => {
                let mut w = std::io::BufWriter::new(PendingFile::create(path)?);
                // The final header has the same length (`header`), written over this at the end.
                w.write_all(&header(0, 0))
                    .map_err(|e| io_err(path, "write", e))?;
                Sink::File(w)
            }
        };
        Ok(F32Writer {
            path: path.to_path_buf(),
            sink,
            cols: None,
            rows: 0,
        })
    }

    /// Append one row (every row of one length).
    pub fn push(&mut self, row: &[f32]) -> Result<()> {
        use std::io::Write;
        if *self.cols.get_or_insert(row.len()) != row.len() {
            return Err(io_err(
                &self.path,
                "append a row",
                std::io::Error::other("rows of different lengths"),
            ));
        }
        match &mut self.sink {
            Sink::Held(_, rows) => rows.push(row.to_vec()),
            Sink::File(w) => {
                for v in row {
                    w.write_all(&v.to_le_bytes())
                        .map_err(|e| io_err(&self.path, "write", e))?;
                }
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Set the header's shape and publish the file (or write the held rows into the stream).
    pub fn finish(self) -> Result<()> {
        use std::io::{Seek, Write};
        match self.sink {
            Sink::Held(f, rows) => {
                let mut w = std::io::BufWriter::new(f);
                let body = rows.iter().flatten().map(|v| v.to_le_bytes());
                let out = w
                    .write_all(&header(self.rows, self.cols.unwrap_or(0)))
                    .and_then(|()| body.into_iter().try_for_each(|b| w.write_all(&b)))
                    .and_then(|()| w.flush());
                out.map_err(|e| io_err(&self.path, "write", e))?;
            }
            Sink::File(w) => {
                let p = w
                    .into_inner()
                    .map_err(|e| io_err(&self.path, "write", e.into_error()))?;
                let h = header(self.rows, self.cols.unwrap_or(0));
                let mut f = p.file();
                f.seek(std::io::SeekFrom::Start(0))
                    .and_then(|_| f.write_all(&h))
                    .map_err(|e| io_err(&self.path, "write the header", e))?;
                p.publish()?;
            }
        }
        Ok(())
    }
}

fn io_err(path: &Path, op: &'static str, source: std::io::Error) -> DecodeError {
    DecodeError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Parse a 2-D (or 1-D, as one row) `<f4` or `<f8` C-order `.npy`.
pub fn decode(bytes: &[u8]) -> std::result::Result<Array2, NpyFault> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(NpyFault::NotNpy);
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        version => return Err(NpyFault::Version { version }),
    };
    let header = bytes
        .get(hstart..hstart + hlen)
        .ok_or(NpyFault::HeaderPastEnd)?;
    let header = std::str::from_utf8(header).map_err(|_| NpyFault::HeaderNotUtf8)?;
    let is_f32 = if header.contains("'<f4'") {
        true
    } else if header.contains("'<f8'") {
        false
    } else {
        return Err(NpyFault::Dtype {
            header: header.to_string(),
        });
    };
    if header.contains("'fortran_order': True") {
        return Err(NpyFault::FortranOrder);
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or(NpyFault::NoShape)?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>().map_err(|_| NpyFault::BadDimension {
                shape: shape.to_string(),
                entry: s.to_string(),
            })
        })
        .collect::<std::result::Result<_, _>>()?;
    let (rows, cols) = match dims[..] {
        [n] => (1, n),
        [r, c] => (r, c),
        _ => {
            return Err(NpyFault::Rank {
                shape: shape.to_string(),
            })
        }
    };
    let width = if is_f32 { 4 } else { 8 };
    let n = rows.checked_mul(cols).ok_or(NpyFault::ShapeOverflow)?;
    let body = &bytes[hstart + hlen..];
    if body.len() != n.checked_mul(width).ok_or(NpyFault::ShapeOverflow)? {
        return Err(NpyFault::DataLength {
            bytes: body.len(),
            shape: shape.to_string(),
        });
    }
    let data = if is_f32 {
        body.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect()
    } else {
        body.chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect()
    };
    Ok(Array2 {
        rows,
        cols,
        data,
        is_f32,
    })
}

/// Largest `.npy` file [`read`] takes.
pub const MAX_NPY_LEN: u64 = 1 << 30;

/// Read a `.npy` file (a regular file of at most [`MAX_NPY_LEN`] bytes).
pub fn read(path: &Path) -> Result<Array2> {
    let bytes = tarfa_format::fsio::read_regular(path, MAX_NPY_LEN)
        .map_err(|e| DecodeError::Format(tarfa_format::Error::from(e)))?;
    decode(&bytes).map_err(|fault| DecodeError::Npy {
        path: path.to_path_buf(),
        fault,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streaming writer's file is `encode_f32`'s bytes (its header fixed up at the end), for
    /// no rows, one, and many; a row of another length is an error, and an unfinished writer
    /// leaves nothing behind.
    #[test]
    fn the_streamed_file_is_the_encoded_array() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in [0usize, 1, 7, 1000] {
            let rows: Vec<Vec<f32>> = (0..n)
                .map(|i| (0..5).map(|j| (i * 5 + j) as f32 * 0.25 - 3.0).collect())
                .collect();
            let p = dir.path().join(format!("{n}.npy"));
            let mut w = F32Writer::create(&p).expect("create");
            for r in &rows {
                w.push(r).expect("push");
            }
            assert_eq!(w.rows(), n);
            w.finish().expect("finish");
            let bytes = std::fs::read(&p).expect("read");
            if n > 0 {
                assert_eq!(bytes, encode_f32(&rows), "{n} rows");
                let a = decode(&bytes).expect("decode");
                assert_eq!((a.rows, a.cols), (n, 5));
            } else {
                assert_eq!(bytes, encode_f32(&[]));
            }
        }
        let p = dir.path().join("bad.npy");
        let mut w = F32Writer::create(&p).expect("create");
        w.push(&[1.0, 2.0]).expect("push");
        assert!(w.push(&[1.0]).is_err(), "a row of another length");
        drop(w);
        assert!(!p.exists());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
    }

    #[test]
    fn each_npy_fault_is_its_own_variant() {
        let npy = |header: &str, body: &[u8]| {
            let mut b = b"\x93NUMPY\x01\x00".to_vec();
            b.extend_from_slice(&(header.len() as u16).to_le_bytes());
            b.extend_from_slice(header.as_bytes());
            b.extend_from_slice(body);
            b
        };
        let h = |descr: &str, fortran: &str, shape: &str| {
            format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': ({shape}), }}")
        };
        let fault = |b: Vec<u8>| decode(&b).expect_err("refused");
        assert_eq!(fault(b"not a npy file".to_vec()), NpyFault::NotNpy);
        let mut v9 = npy(&h("<f4", "False", "1,"), &[0; 4]);
        v9[6] = 9;
        assert_eq!(fault(v9), NpyFault::Version { version: 9 });
        let mut past = npy(&h("<f4", "False", "1,"), &[]);
        past[8] = 0xff;
        assert_eq!(fault(past), NpyFault::HeaderPastEnd);
        let mut utf = npy("{'shape': (1,)}", &[]);
        utf[10] = 0xff;
        assert_eq!(fault(utf), NpyFault::HeaderNotUtf8);
        let i4 = h("<i4", "False", "1,");
        assert_eq!(
            fault(npy(&i4, &[0; 4])),
            NpyFault::Dtype { header: i4.clone() }
        );
        assert_eq!(
            fault(npy(&h("<f4", "True", "1,"), &[0; 4])),
            NpyFault::FortranOrder
        );
        assert_eq!(
            fault(npy("{'descr': '<f4', 'fortran_order': False}", &[])),
            NpyFault::NoShape
        );
        assert_eq!(
            fault(npy(&h("<f4", "False", "x,"), &[])),
            NpyFault::BadDimension {
                shape: "x,".into(),
                entry: "x".into()
            }
        );
        assert_eq!(
            fault(npy(&h("<f4", "False", "1, 1, 1"), &[0; 4])),
            NpyFault::Rank {
                shape: "1, 1, 1".into()
            }
        );
        let big = format!("{}, {}", usize::MAX, 2);
        assert_eq!(
            fault(npy(&h("<f4", "False", &big), &[])),
            NpyFault::ShapeOverflow
        );
        assert_eq!(
            fault(npy(&h("<f8", "False", "2,"), &[0; 8])),
            NpyFault::DataLength {
                bytes: 8,
                shape: "2,".into()
            }
        );
    }

    #[test]
    fn encoded_npy_reads_back_with_the_same_bits() {
        let rows = vec![
            vec![1.0f32, -0.0, f32::MIN_POSITIVE],
            vec![3.5, 1e-30, -7.25],
        ];
        let b = encode_f32(&rows);
        assert_eq!((b.len() - 3 * 2 * 4) % 64, 0, "header padded to 64");
        let a = decode(&b).expect("decodes");
        assert_eq!((a.rows, a.cols, a.is_f32), (2, 3, true));
        for (r, row) in rows.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                assert_eq!((a.row(r)[c] as f32).to_bits(), v.to_bits());
            }
        }
    }
}
