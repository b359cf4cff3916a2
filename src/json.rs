//! `--json` output: one document per invocation, each carrying its `"schema"` (docs/json.md names
//! every field), with non-finite numbers kept distinguishable from a missing figure.

use serde_json::Value;

/// `x` as JSON: a number when finite; else the string `"NaN"`, `"inf"` or `"-inf"` (serde_json
/// would write `null` for all three, the same as "no figure").
pub fn float(x: f64) -> Value {
    if x.is_finite() {
        serde_json::json!(x)
    } else if x.is_nan() {
        Value::from("NaN")
    } else if x > 0.0 {
        Value::from("inf")
    } else {
        Value::from("-inf")
    }
}

/// [`float`] of a figure that may be absent (`null`).
pub fn float_opt(x: Option<f64>) -> Value {
    x.map_or(Value::Null, float)
}

/// [`float`] as a serde field serializer: `#[serde(serialize_with = "crate::json::ser_float")]`
/// on an `f64` field of a struct that derives `Serialize`.
pub fn ser_float<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&float(*x), s)
}

/// [`float_opt`] as a serde field serializer, for an `Option<f64>` field.
pub fn ser_float_opt<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&float_opt(*x), s)
}

/// `body` (an object) with `"schema": schema` added.
pub fn document(schema: &str, body: impl serde::Serialize) -> anyhow::Result<Value> {
    let mut v = serde_json::to_value(body)?;
    match v.as_object_mut() {
        Some(o) => {
            o.insert("schema".into(), Value::from(schema));
        }
        None => anyhow::bail!("internal: a {schema} document must be a JSON object"),
    }
    Ok(v)
}

/// Print `doc` on stdout: the invocation's one JSON document.
pub fn print(doc: &Value) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string_pretty(doc)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_numbers_stay_distinguishable_from_null_and_from_each_other() {
        assert_eq!(float(f64::NAN), Value::from("NaN"));
        assert_eq!(float(f64::INFINITY), Value::from("inf"));
        assert_eq!(float(f64::NEG_INFINITY), Value::from("-inf"));
        assert_eq!(float(1.5), serde_json::json!(1.5));
        assert_eq!(float_opt(None), Value::Null);
        assert_eq!(float_opt(Some(f64::NAN)), Value::from("NaN"));
    }

    #[test]
    fn a_document_carries_its_schema() {
        let d = document("tarfa.x/1", serde_json::json!({"a": 1})).expect("object");
        assert_eq!(d["schema"], "tarfa.x/1");
        assert_eq!(d["a"], 1);
        assert!(document("tarfa.x/1", 3).is_err());
    }
}
