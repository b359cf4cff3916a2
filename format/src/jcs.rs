//! Canonical JSON of the manifest digest (spec §8.1.2): RFC 8785, the JSON Canonicalization
//! Scheme (JCS), with one stated deviation — integers are kept exact.
//!
//! - objects: members sorted by their keys' UTF-16 code units (RFC 8785 §3.2.3), no whitespace;
//! - strings: `"`, `\`, and U+0000..U+001F escaped as ECMAScript `JSON.stringify` does
//!   (`\b \t \n \f \r`, else `\u00xx` in lowercase hex), everything else raw UTF-8 (§3.2.2.2);
//! - numbers that are floats (a `.` or an exponent in the text, `-0`, or an integer outside
//!   `-2^63 ..= 2^64 - 1`): ECMAScript `Number.prototype.toString` of the `f64` (§3.2.2.3);
//! - integers (no `.` or exponent, in `-2^63 ..= 2^64 - 1`): their exact decimal digits. For
//!   `|n| <= 2^53` this is what JCS writes; past it JCS would round to an `f64` (I-JSON), which
//!   would lose the manifest's nanosecond times and 64-bit GGUF values, so they stay exact.
//!
//! The code is ours, not a crate's, so the digest cannot move with a dependency's version
//! (review finding 13: serde_json wrote `1e300` in one version and `1e+300` in another).

use serde_json::Value;

/// Append the canonical form of `v` to `out`. With `skip_top` the top-level object's member of
/// that key is left out (the manifest's own `digest`).
pub fn write(v: &Value, out: &mut Vec<u8>, skip_top: Option<&str>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                // serde_json holds no non-finite number, and every other number is an f64.
                out.extend_from_slice(number(n.as_f64().unwrap_or(f64::NAN)).as_bytes());
            }
        }
        Value::String(s) => string(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out, None);
            }
            out.push(b']');
        }
        Value::Object(o) => {
            let mut members: Vec<(&String, &Value)> = o
                .iter()
                .filter(|(k, _)| Some(k.as_str()) != skip_top)
                .collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, x)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(k, out);
                out.push(b':');
                write(x, out, None);
            }
            out.push(b'}');
        }
    }
}

/// The canonical bytes of `v`.
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(v, &mut out, None);
    out
}

/// A string as RFC 8785 §3.2.2.2 (ECMAScript `JSON.stringify`) writes it.
fn string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// A finite `f64` as ECMAScript `Number.prototype.toString` writes it (ECMA-262 Number::toString,
/// RFC 8785 §3.2.2.3): the shortest digits that read back as `x` (the closest such digits when
/// there are several), then decimal notation when the decimal exponent is in `-7 < e < 21`, else
/// `d.ddde±x`. Both zeros are `0`. Non-finite values (which JSON cannot hold) give `null`.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` is the shortest round-trip form, `D.DDDe±X` without a `+`; take its digit
    // count (`len`).
    let shortest = format!("{:e}", x.abs());
    let len = shortest
        .split_once('e')
        .map_or(0, |(m, _)| m.len() - usize::from(m.contains('.')));
    // Among digit strings of that length that read back as `x`, ECMAScript takes the closest,
    // and of two equally close the even one; `{:e}` may take the other (1424953923781206.25 is
    // `1424953923781206.2` in ECMAScript, `1.4249539237812063e15` from `{:e}`). The correctly
    // rounded `len` digits (`{:.*e}` rounds half to even) are the closest: use them when they
    // read back as `x`.
    let rounded = format!("{:.*e}", len.saturating_sub(1), x.abs());
    let e = if rounded.parse::<f64>() == Ok(x.abs()) {
        rounded
    } else {
        shortest
    };
    // Its digits `s` (k of them) and n, the position of the decimal point: x = 0.s × 10^n.
    let (mant, exp) = e.split_once('e').unwrap_or((e.as_str(), "0"));
    let s: String = mant.chars().filter(|c| *c != '.').collect();
    let k = s.len() as i64;
    let n = exp.parse::<i64>().unwrap_or(0) + 1;
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&s);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&s[..n as usize]);
        out.push('.');
        out.push_str(&s[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&s);
    } else {
        out.push_str(&s[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&s[1..]);
        }
        out.push('e');
        out.push(if n >= 1 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let v: Value = serde_json::from_str(text).expect("JSON");
        String::from_utf8(to_vec(&v)).expect("UTF-8")
    }

    /// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical numbers.
    #[test]
    fn rfc8785_appendix_b_numbers() {
        let table: [(u64, &str); 22] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
        ];
        for (bits, want) in table {
            assert_eq!(number(f64::from_bits(bits)), want, "{bits:016x}");
        }
        assert_eq!(
            number(f64::from_bits(0xbecbf647612f3696)),
            "-0.0000033333333333333333"
        );
        assert_eq!(
            number(f64::from_bits(0x43143ff3c1cb0959)),
            "1424953923781206.2"
        );
        // The table's NaN and Infinity have no JSON form (serde_json refuses them on parse).
        assert!(serde_json::from_str::<Value>("1e400").is_err());
    }

    /// RFC 8785 §3.2.2 (the example of §3.2.2's input) and §3.2.3 (sorting by UTF-16 code
    /// units: U+FB33 sorts after the emoji U+1F600, whose first code unit is D83D, though its
    /// UTF-8 bytes sort before).
    #[test]
    fn rfc8785_examples() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        let sorting = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        assert_eq!(
            canon(sorting),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\
             \"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// The integer rule on both sides of 2^53 and of the 64-bit range (§8.1.2).
    #[test]
    fn integers_stay_exact_and_floats_are_ecmascript_numbers() {
        assert_eq!(
            canon("[9007199254740992, 9007199254740993, 18446744073709551615, -9223372036854775808, 1764547200123456789]"),
            "[9007199254740992,9007199254740993,18446744073709551615,-9223372036854775808,1764547200123456789]"
        );
        // The same values as floats (or past 64 bits) are f64s: rounded, as JCS writes them.
        assert_eq!(
            canon("[9007199254740993.0, 18446744073709551616, -9223372036854775809, 1764547200123456789e0]"),
            "[9007199254740992,18446744073709552000,-9223372036854776000,1764547200123456800]"
        );
        assert_eq!(
            canon("[-0, -0.0, 0.0, 1.0, 1E2, 0.1, 1e300, 1e-7, 1e-6, 1e20, 1e21, 5e-324, 1.5]"),
            "[0,0,0,1,100,0.1,1e+300,1e-7,0.000001,100000000000000000000,1e+21,5e-324,1.5]"
        );
    }

    #[test]
    fn strings_escape_only_what_json_stringify_escapes() {
        assert_eq!(
            canon(r#"["\u0000\u0001\b\t\n\u000b\f\r\u001f \"\\\/\u007f\u00e9\ud83d\ude00\ue000"]"#),
            "[\"\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\\"\\\\/\u{7f}é😀\u{e000}\"]"
        );
        // serde_json refuses a lone surrogate, so no manifest can hold one.
        assert!(serde_json::from_str::<Value>(r#"["\ud800"]"#).is_err());
    }
}
