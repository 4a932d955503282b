//! Turning JS values into the binding's option structs with Ferry's errors: a wrong type,
//! a missing field or an unknown key becomes `ERR_FERRY_INVALID_ARGUMENT` naming the field
//! and what was expected — never napi's own `NumberExpected`, and never a silently ignored
//! typo such as `peerTimeoutMS`.

use ferry_core::{Error, Numbered, TransportKind};
use napi::bindgen_prelude::{FromNapiValue, Object, ToNapiValue, Unknown};
use napi::{Env, JsValue, Status, ValueType};

/// `value` as an integer, if it is a non-negative one that a double holds exactly
/// (at most 2^53 - 1; NaN and infinities are not).
pub(crate) fn exact_u64(value: f64) -> Option<u64> {
    // Integral iff the truncating cast round-trips (cheaper than `fract`, a libm call on
    // baseline x86-64, and this runs for every offset of a block list).
    let v = value as u64;
    ((0.0..=9_007_199_254_740_991.0).contains(&value) && v as f64 == value).then_some(v)
}

/// A JS number that must be a non-negative integer, exact in a double.
pub(crate) fn to_u64(value: f64, what: &str) -> Result<u64, Error> {
    exact_u64(value).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} must be a non-negative integer, got {value}"
        ))
    })
}

/// The entry numbered `value` of a Rust-owned table (`Opcode`, `TransportKind`, …): any
/// other number, an out-of-range or fractional one included, is refused naming `what`
/// and the numbers there are.
pub(crate) fn numbered<T: Numbered>(value: f64, what: &str) -> Result<T, Error> {
    exact_u64(value)
        .and_then(|n| u32::try_from(n).ok())
        .and_then(|n| T::from_number(n).ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{what} must be {}, got {value}", T::choices()))
        })
}

/// A transport by number, 0 for none (`numbered` otherwise).
pub(crate) fn opt_transport(value: f64, what: &str) -> Result<Option<TransportKind>, Error> {
    if value == 0.0 {
        return Ok(None);
    }
    numbered(value, what).map(Some).map_err(|_| {
        Error::InvalidArgument(format!(
            "{what} must be 0 (none), {}, got {value}",
            TransportKind::choices()
        ))
    })
}

/// An optional non-negative integer field.
pub(crate) fn opt_u64(value: Option<f64>, what: &str) -> Result<Option<u64>, Error> {
    value.map(|v| to_u64(v, what)).transpose()
}

/// An optional integer field that must fit `T` (e.g. a count held as `usize` or `u32`).
pub(crate) fn opt_int<T: TryFrom<u64>>(value: Option<f64>, what: &str) -> Result<Option<T>, Error> {
    opt_u64(value, what)?
        .map(|v| {
            T::try_from(v)
                .map_err(|_| Error::InvalidArgument(format!("{what} is too large, got {v}")))
        })
        .transpose()
}

/// An optional duration field given in whole milliseconds.
pub(crate) fn opt_ms(value: Option<f64>, what: &str) -> Result<Option<std::time::Duration>, Error> {
    Ok(opt_u64(value, what)?.map(std::time::Duration::from_millis))
}

/// What JS type a value has, for messages ("got a string").
fn describe(value: &Unknown) -> &'static str {
    match value.get_type() {
        Ok(ValueType::Undefined) => "undefined",
        Ok(ValueType::Null) => "null",
        Ok(ValueType::Boolean) => "a boolean",
        Ok(ValueType::Number) => "a number",
        Ok(ValueType::String) => "a string",
        Ok(ValueType::Symbol) => "a symbol",
        Ok(ValueType::Object) => match value.is_array() {
            Ok(true) => "an array",
            _ => "an object",
        },
        Ok(ValueType::BigInt) => "a bigint",
        Ok(ValueType::Function) => "a function",
        _ => "a value of another kind",
    }
}

/// What napi's status says was expected.
fn expected(status: &Status) -> &'static str {
    match status {
        Status::NumberExpected => "a number",
        Status::StringExpected => "a string",
        Status::BooleanExpected => "a boolean",
        Status::ObjectExpected => "an object",
        Status::ArrayExpected => "an array",
        Status::BigintExpected => "a bigint",
        Status::FunctionExpected => "a function",
        _ => "a value of the documented type",
    }
}

/// The JS path of a napi field error: "… on RdmaOptions.qpsPerPeer on EngineOptions.rdma"
/// names `rdma.qpsPerPeer`.
fn field_path(reason: &str) -> Option<String> {
    let fields: Vec<&str> = reason
        .split(" on ")
        .skip(1)
        .filter_map(|part| part.split_once('.').map(|(_, field)| field))
        .collect();
    if fields.is_empty() {
        return None;
    }
    Some(fields.iter().rev().copied().collect::<Vec<_>>().join("."))
}

/// The value at `path` inside `root`, if every step is an object.
fn value_at<'a>(root: &Unknown<'a>, path: &str) -> Option<Unknown<'a>> {
    let mut current = *root;
    for step in path.split('.') {
        if current.get_type().ok()? != ValueType::Object {
            return None;
        }
        let obj = Object::from_unknown(current).ok()?;
        current = obj.get::<Unknown>(step).ok()??;
    }
    Some(current)
}

/// Ferry's error for a failed napi conversion of `root` (named `what` in messages).
fn conversion_error(e: napi::Error, root: &Unknown, what: &str) -> Error {
    let reason = e.reason.clone();
    if let Some(missing) = reason
        .strip_prefix("Missing field `")
        .and_then(|r| r.split('`').next())
    {
        return Error::InvalidArgument(format!("{what}.{missing} is required"));
    }
    match field_path(&reason) {
        Some(path) => {
            let got = value_at(root, &path).map_or("another type", |v| describe(&v));
            Error::InvalidArgument(format!(
                "{what}.{path} must be {}, got {got}",
                expected(&e.status)
            ))
        }
        None => Error::InvalidArgument(format!("{what}: {reason}")),
    }
}

/// The first key of `given` (defined, at any depth) that `known` — the same object as
/// converted and written back — lacks: a key the option struct does not declare.
fn unknown_key(
    given: &Unknown,
    known: &Unknown,
    path: &str,
) -> Result<Option<String>, napi::Error> {
    if given.get_type()? != ValueType::Object || known.get_type()? != ValueType::Object {
        return Ok(None);
    }
    let (given, known) = (Object::from_unknown(*given)?, Object::from_unknown(*known)?);
    let is_array = given.is_array()?;
    for key in Object::keys(&given)? {
        let Some(value) = given.get::<Unknown>(&key)? else {
            continue; // an explicit `undefined` is the same as leaving the key out
        };
        let here = match (path.is_empty(), is_array) {
            (_, true) => format!("{path}[{key}]"),
            (true, false) => key.clone(),
            (false, false) => format!("{path}.{key}"),
        };
        match known.get::<Unknown>(&key)? {
            None => return Ok(Some(here)),
            Some(inner) => {
                if let Some(found) = unknown_key(&value, &inner, &here)? {
                    return Ok(Some(found));
                }
            }
        }
    }
    Ok(None)
}

/// Converts an option object: it must be an object (or absent), of the declared fields
/// with the declared types, and name no other key.
pub(crate) fn options<T>(env: &Env, value: Option<Unknown>, what: &str) -> Result<T, Error>
where
    T: FromNapiValue + ToNapiValue + Clone + Default,
{
    let Some(value) = value else {
        return Ok(T::default());
    };
    match value.get_type() {
        Ok(ValueType::Undefined) => return Ok(T::default()),
        Ok(ValueType::Object) if !value.is_array().unwrap_or(true) => {}
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{what} must be an object, got {}",
                describe(&value)
            )))
        }
    }
    let converted = T::from_unknown(value).map_err(|e| conversion_error(e, &value, what))?;
    // Written back into the same env, it has exactly the keys the struct declares.
    let known = converted
        .clone()
        .into_unknown(env)
        .map_err(|e| Error::InvalidArgument(format!("{what}: {}", e.reason)))?;
    match unknown_key(&value, &known, "") {
        Ok(None) => Ok(converted),
        Ok(Some(key)) => Err(Error::InvalidArgument(format!(
            "{what} has no option {key:?} (a typo?)"
        ))),
        Err(e) => Err(Error::InvalidArgument(format!("{what}: {}", e.reason))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_checked_not_truncated() {
        assert_eq!(to_u64(0.0, "x"), Ok(0));
        assert_eq!(
            to_u64(9_007_199_254_740_991.0, "x"),
            Ok(9_007_199_254_740_991)
        );
        for bad in [-1.0, 1.5, 0.9, f64::NAN, f64::INFINITY, 2f64.powi(53)] {
            assert!(to_u64(bad, "x").is_err(), "{bad}");
        }
        assert_eq!(
            opt_int::<u32>(Some(2f64.powi(32) + 1.0), "n")
                .unwrap_err()
                .code(),
            "ERR_FERRY_INVALID_ARGUMENT"
        );
        assert_eq!(opt_int::<u32>(Some(7.0), "n"), Ok(Some(7)));
        assert_eq!(opt_ms(None, "t"), Ok(None));
    }

    #[test]
    fn table_numbers_out_of_range_are_refused_with_a_typed_error() {
        use ferry_core::Opcode;
        assert_eq!(numbered::<Opcode>(1.0, "opcode"), Ok(Opcode::Write));
        for bad in [2.0, -1.0, 0.5, f64::NAN, 4_294_967_296.0] {
            let e = numbered::<Opcode>(bad, "opcode").expect_err("refused");
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT", "{bad}");
            assert_eq!(
                e.to_string(),
                format!("invalid argument: opcode must be 0 (read) or 1 (write), got {bad}")
            );
        }
        assert_eq!(opt_transport(0.0, "transport"), Ok(None));
        assert_eq!(
            opt_transport(2.0, "transport"),
            Ok(Some(TransportKind::Shm))
        );
        for bad in [4.0, 255.0, -0.5, 3.5, f64::INFINITY] {
            let e = opt_transport(bad, "transport").expect_err("refused");
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT", "{bad}");
            assert!(e.to_string().ends_with(&format!(
                "transport must be 0 (none), 1 (tcp), 2 (shm) or 3 (rdma), got {bad}"
            )));
        }
    }

    #[test]
    fn napi_field_errors_name_the_js_path() {
        assert_eq!(
            field_path("Failed to convert napi value into rust type `f64` on RdmaOptions.qpsPerPeer on EngineOptions.rdma"),
            Some("rdma.qpsPerPeer".into())
        );
        assert_eq!(
            field_path("Failed on EngineOptions.listen"),
            Some("listen".into())
        );
        assert_eq!(field_path("no field here"), None);
    }
}
