//! JSON text for attribute values, byte for byte what the Python decoder's `orjson.dumps` writes for
//! the same values (the differential test in tests/test_native_decoder.py holds the two together).

use std::collections::HashMap;

use base64::Engine;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

/// How an object's keys are ordered: span attributes are stored sorted, so equal attribute sets have
/// equal text; resources, events, links and values inside them keep the order they were sent in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Sorted,
    Sent,
}

pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A float as orjson writes it: ryu's shortest digits, `null` for NaN and infinities, and a signed
/// exponent (`1e+20`, `1e-7`).
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    if !v.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(v).as_bytes();
    match text.iter().position(|&c| c == b'e') {
        Some(e) if text.get(e + 1) != Some(&b'-') => {
            out.extend_from_slice(&text[..=e]);
            out.push(b'+');
            out.extend_from_slice(&text[e + 1..]);
        }
        _ => out.extend_from_slice(text),
    }
}

pub fn write_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

pub fn write_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Bytes as text: base64, OTLP/JSON's convention for bytes, which the Python decoder keeps too.
pub fn bytes_text(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The value an AnyValue holds, if any. A string-table index (OTLP profiles only) means nothing
/// outside a profile's dictionary: no value, as for the reference decoder.
pub fn held(value: Option<&AnyValue>) -> Option<&Value> {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValueStrindex(_)) | None => None,
        held => held,
    }
}

pub fn write_value(out: &mut Vec<u8>, value: Option<&AnyValue>, order: Order) {
    match held(value) {
        None | Some(Value::StringValueStrindex(_)) => out.extend_from_slice(b"null"),
        Some(Value::StringValue(s)) => write_str(out, s),
        Some(Value::BoolValue(b)) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Some(Value::IntValue(i)) => write_i64(out, *i),
        Some(Value::DoubleValue(d)) => write_f64(out, *d),
        Some(Value::BytesValue(b)) => write_str(out, &bytes_text(b)),
        Some(Value::ArrayValue(a)) => {
            out.push(b'[');
            for (i, v) in a.values.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, Some(v), order);
            }
            out.push(b']');
        }
        Some(Value::KvlistValue(kvs)) => write_object(out, &kvs.values, order),
    }
}

/// A repeated KeyValue as a JSON object. A repeated key keeps its first place and its last value,
/// as a Python dict built from the pairs in order does.
pub fn write_object(out: &mut Vec<u8>, kvs: &[KeyValue], order: Order) {
    let entries = unique_entries(kvs, order);
    out.push(b'{');
    for (i, kv) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, kv.0);
        out.push(b':');
        write_value(out, kv.1, order);
    }
    out.push(b'}');
}

pub type Entry<'a> = (&'a String, Option<&'a AnyValue>);

/// The pairs with repeated keys resolved (first place, last value), in the requested order.
pub fn unique_entries(kvs: &[KeyValue], order: Order) -> Vec<Entry<'_>> {
    let mut entries: Vec<Entry<'_>> = Vec::with_capacity(kvs.len());
    match order {
        Order::Sorted => {
            entries.extend(kvs.iter().map(|kv| (&kv.key, kv.value.as_ref())));
            // Stable, so among equal keys the last sent stays last; keep that one.
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            entries.reverse();
            entries.dedup_by(|later, earlier| later.0 == earlier.0);
            entries.reverse();
        }
        // A hash map only for long lists, so that a hostile list of many keys stays linear.
        Order::Sent if kvs.len() > 16 => {
            let mut at: HashMap<&str, usize> = HashMap::with_capacity(kvs.len());
            for kv in kvs {
                match at.get(kv.key.as_str()) {
                    Some(&i) => entries[i].1 = kv.value.as_ref(),
                    None => {
                        at.insert(&kv.key, entries.len());
                        entries.push((&kv.key, kv.value.as_ref()));
                    }
                }
            }
        }
        Order::Sent => {
            for kv in kvs {
                match entries.iter_mut().find(|e| *e.0 == kv.key) {
                    Some(e) => e.1 = kv.value.as_ref(),
                    None => entries.push((&kv.key, kv.value.as_ref())),
                }
            }
        }
    }
    entries
}
