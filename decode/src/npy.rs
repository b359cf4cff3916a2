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
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        rows.len(),
        cols
    );
    // Magic (6) + version (2) + header length (2) + dict + padding + '\n', a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    let mut out = Vec::with_capacity(unpadded + pad + rows.len() * cols * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    for r in rows {
        assert_eq!(r.len(), cols, "rows of one length");
        for v in r {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Write `rows` as a `.npy` file, published atomically (temp, fsync, rename, fsync the directory).
pub fn write_f32(path: &Path, rows: &[Vec<f32>]) -> Result<()> {
    tarfa_format::publish::write_atomic(path, &encode_f32(rows))?;
    Ok(())
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
