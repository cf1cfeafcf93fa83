//! The walk over one ExportTraceServiceRequest: validation, the stored span columns, and the values of
//! the attribute keys normalization reads, gathered into one column per key.
//!
//! It mirrors `collector/span_walk.py` (the reference): the same checks in the same order with the
//! same explanations, the same JSON, the same gathered columns.

// The gatherer's index and the left-out set hold keys of our own choosing and are only looked up with
// what a request sends, so a hostile key can lengthen no chain: the faster, unseeded hash is safe here
// (not in json.rs, whose map holds a request's own keys).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
};
use arrow_array::types::TimestampNanosecondType;
use arrow_array::{ArrayRef, NullArray, PrimitiveArray, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema, TimeUnit};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::json::{
    bytes_text, held, unique_entries, write_object, write_str, write_u64, write_value, Order,
};
use crate::scores::Scores;

/// Span times must stay below 2^63 ns, the range of a nanosecond timestamp (model/columns.py).
const MAX_TIME_NS: u64 = (1 << 63) - 1;
const SPAN_KINDS: [&str; 6] = [
    "UNSPECIFIED",
    "INTERNAL",
    "SERVER",
    "CLIENT",
    "PRODUCER",
    "CONSUMER",
];
const STATUS_CODES: [&str; 3] = ["UNSET", "OK", "ERROR"];

/// Rejected spans by reason, in the order reasons were first met, each with its first explanation.
#[derive(Default)]
pub struct Rejections(pub Vec<(&'static str, u64, String)>);

impl Rejections {
    fn add(&mut self, reason: &'static str, explanation: impl FnOnce() -> String) {
        match self.0.iter_mut().find(|r| r.0 == reason) {
            Some(r) => r.1 += 1,
            None => self.0.push((reason, 1, explanation())),
        }
    }
}

/// One requested attribute key's value for every row, or None where a row lacks it.
struct Gathered<'a> {
    key: &'a str,
    values: Vec<Option<&'a AnyValue>>,
}

/// Gathers the values of a fixed set of keys into columns, one row at a time.
struct Gatherer<'a> {
    index: HashMap<&'a str, usize>,
    columns: Vec<Option<Gathered<'a>>>,
    keys: &'a [String],
    rows: usize,
}

impl<'a> Gatherer<'a> {
    fn new(keys: &'a [String]) -> Self {
        let index = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), i))
            .collect();
        Gatherer {
            index,
            columns: (0..keys.len()).map(|_| None).collect(),
            keys,
            rows: 0,
        }
    }

    fn add_row(&mut self, entries: &[(&'a String, Option<&'a AnyValue>)]) {
        for (key, value) in entries {
            if let Some(&i) = self.index.get(key.as_str()) {
                let rows = self.rows;
                let column = self.columns[i].get_or_insert_with(|| Gathered {
                    key: &self.keys[i],
                    values: Vec::new(),
                });
                column.values.resize(rows, None);
                column.values.push(*value);
            }
        }
        self.rows += 1;
    }

    /// A batch with a column per key seen, and the keys whose column holds JSON text because their
    /// values were not all of one scalar kind.
    fn finish(self) -> Result<(RecordBatch, Vec<String>), ArrowError> {
        let rows = self.rows;
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        let mut mixed = Vec::new();
        for mut column in self.columns.into_iter().flatten() {
            column.values.resize(rows, None);
            let (array, is_json) = gathered_array(&column.values);
            if is_json {
                mixed.push(column.key.to_string());
            }
            fields.push(Field::new(column.key, array.data_type().clone(), true));
            arrays.push(array);
        }
        let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
        Ok((
            RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), arrays, &options)?,
            mixed,
        ))
    }
}

#[derive(PartialEq, Clone, Copy)]
enum Kind {
    None,
    Str,
    Int,
    Double,
    Bool,
    Mixed,
}

fn kind_of(value: Option<&AnyValue>) -> Kind {
    match held(value) {
        None => Kind::None,
        Some(Value::StringValue(_)) | Some(Value::BytesValue(_)) => Kind::Str,
        Some(Value::IntValue(_)) => Kind::Int,
        Some(Value::DoubleValue(_)) => Kind::Double,
        Some(Value::BoolValue(_)) => Kind::Bool,
        Some(_) => Kind::Mixed,
    }
}

/// The column of one gathered key: typed when every value present is of one scalar kind (bytes count
/// as their base64 text), else each value's JSON text.
fn gathered_array(values: &[Option<&AnyValue>]) -> (ArrayRef, bool) {
    let mut kind = Kind::None;
    for v in values {
        let k = kind_of(*v);
        if k != Kind::None && k != kind {
            kind = if kind == Kind::None { k } else { Kind::Mixed };
        }
        if kind == Kind::Mixed {
            break;
        }
    }
    fn scalar<'v>(v: &Option<&'v AnyValue>) -> Option<&'v Value> {
        held(*v)
    }
    let array: ArrayRef = match kind {
        Kind::None => Arc::new(NullArray::new(values.len())),
        Kind::Str => {
            let mut b = StringBuilder::with_capacity(values.len(), values.len() * 8);
            for v in values {
                match scalar(v) {
                    Some(Value::StringValue(s)) => b.append_value(s),
                    Some(Value::BytesValue(bytes)) => b.append_value(bytes_text(bytes)),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        Kind::Int => {
            let mut b = Int64Builder::with_capacity(values.len());
            values.iter().for_each(|v| {
                b.append_option(if let Some(Value::IntValue(i)) = scalar(v) {
                    Some(*i)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        Kind::Double => {
            let mut b = Float64Builder::with_capacity(values.len());
            values.iter().for_each(|v| {
                b.append_option(if let Some(Value::DoubleValue(d)) = scalar(v) {
                    Some(*d)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        Kind::Bool => {
            let mut b = BooleanBuilder::with_capacity(values.len());
            values.iter().for_each(|v| {
                b.append_option(if let Some(Value::BoolValue(x)) = scalar(v) {
                    Some(*x)
                } else {
                    None
                })
            });
            Arc::new(b.finish())
        }
        Kind::Mixed => {
            let mut b = StringBuilder::with_capacity(values.len(), values.len() * 8);
            let mut text = Vec::new();
            for v in values {
                if scalar(v).is_none() {
                    b.append_null();
                } else {
                    text.clear();
                    write_value(&mut text, *v, Order::Sent);
                    b.append_value(std::str::from_utf8(&text).unwrap_or_default());
                }
            }
            Arc::new(b.finish())
        }
    };
    (array, kind == Kind::Mixed)
}

/// The stored columns of the accepted spans.
#[derive(Default)]
struct Columns {
    trace_id: StringBuilder,
    span_id: StringBuilder,
    parent_span_id: StringBuilder,
    name: StringBuilder,
    kind: StringBuilder,
    start: Vec<i64>,
    end: Vec<i64>,
    duration_ms: Float64Builder,
    status_code: StringBuilder,
    status_message: StringBuilder,
    service_name: StringBuilder,
    scope_name: StringBuilder,
    attributes: StringBuilder,
    left_out: StringBuilder,
    resource: StringBuilder,
    events: StringBuilder,
    links: StringBuilder,
    resource_index: Int32Builder,
}

pub struct Walked {
    pub spans: RecordBatch,
    pub span_values: RecordBatch,
    pub span_json_keys: Vec<String>,
    pub resource_values: RecordBatch,
    pub resource_json_keys: Vec<String>,
    pub rejections: Rejections,
    /// Scores with each one's row, and the first-token times from events (crate::scores).
    pub scores: RecordBatch,
    pub first_tokens: RecordBatch,
    /// Rows whose scores the reference reads (crate::scores): none of theirs is in `scores`.
    pub scores_left: Vec<i32>,
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xf) as usize] as char);
    }
    s
}

fn id_problem(what: &str, value: &[u8], size: usize) -> String {
    if value.len() == size {
        format!("{what} ids must not be all zeros")
    } else {
        format!(
            "{what} ids must be {} bit, received {} bits",
            size * 8,
            value.len() * 8
        )
    }
}

/// Why a span is turned away, if it is: the checks of the reference decoder, in its order.
fn check(s: &Span, rejections: &mut Rejections) -> bool {
    let (tid, sid, parent) = (&s.trace_id, &s.span_id, &s.parent_span_id);
    let (start, end) = (s.start_time_unix_nano, s.end_time_unix_nano);
    if tid.len() != 16 || tid.iter().all(|&b| b == 0) {
        rejections.add("invalid_trace_id", || id_problem("trace", tid, 16));
    } else if sid.len() != 8 || sid.iter().all(|&b| b == 0) {
        rejections.add("invalid_span_id", || id_problem("span", sid, 8));
    } else if !parent.is_empty() && parent.len() != 8 {
        rejections.add("invalid_parent_span_id", || {
            format!(
                "parent span ids must be 64 bit, received {} bits",
                parent.len() * 8
            )
        });
    } else if start == 0 {
        rejections.add("missing_start_time", || {
            "start_time_unix_nano is 0".to_string()
        });
    } else if start > MAX_TIME_NS || end > MAX_TIME_NS {
        rejections.add("invalid_time", || {
            "span times must be below 2^63 ns".to_string()
        });
    } else if end < start {
        rejections.add("end_before_start", || {
            format!(
                "end_time_unix_nano is {} ns before start_time_unix_nano",
                start - end
            )
        });
    } else {
        return true;
    }
    false
}

fn optional(b: &mut StringBuilder, text: &str) {
    if text.is_empty() {
        b.append_null()
    } else {
        b.append_value(text)
    }
}

fn json_list<T>(
    b: &mut StringBuilder,
    items: &[T],
    text: &mut Vec<u8>,
    write: impl Fn(&mut Vec<u8>, &T),
) {
    if items.is_empty() {
        b.append_null();
        return;
    }
    text.clear();
    text.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            text.push(b',');
        }
        write(text, item);
    }
    text.push(b']');
    b.append_value(std::str::from_utf8(text).unwrap_or_default());
}

fn attributes_member(text: &mut Vec<u8>, kvs: &[KeyValue]) {
    text.extend_from_slice(b",\"attributes\":");
    write_object(text, kvs, Order::Sent);
    text.push(b'}');
}

/// Appends `key: value` to an object being written (`text` holds its opening brace and earlier pairs).
fn write_pair(text: &mut Vec<u8>, key: &str, value: Option<&AnyValue>) {
    if text.len() > 1 {
        text.push(b',');
    }
    write_str(text, key);
    text.push(b':');
    write_value(text, value, Order::Sorted);
}

/// `left_out`: the attribute keys written to the `left_out` column (a JSON object of their own, null when a
/// span has none of them) instead of `attributes` when they hold a value (model/attribute_split.py).
pub fn walk(
    request: &ExportTraceServiceRequest,
    span_keys: &[String],
    resource_keys: &[String],
    left_out: &[String],
) -> Result<Walked, ArrowError> {
    let left_out: HashSet<&str> = left_out.iter().map(String::as_str).collect();
    let mut out_text = Vec::with_capacity(256);
    let mut c = Columns::default();
    let mut rejections = Rejections::default();
    let mut span_values = Gatherer::new(span_keys);
    let mut resource_values = Gatherer::new(resource_keys);
    let mut text = Vec::with_capacity(1024);
    let mut resource_json = String::new();
    let mut scores = Scores::default();
    let mut row: i32 = 0;

    let empty = Vec::new();
    for (resource_index, rs) in request.resource_spans.iter().enumerate() {
        let resource_kvs = rs.resource.as_ref().map_or(&empty, |r| &r.attributes);
        let entries = unique_entries(resource_kvs, Order::Sent);
        text.clear();
        write_object(&mut text, resource_kvs, Order::Sent);
        resource_json.clear();
        resource_json.push_str(std::str::from_utf8(&text).unwrap_or_default());
        // A text value names the service; bytes count as their base64 text, as in the reference.
        let service = entries
            .iter()
            .find(|e| e.0 == "service.name")
            .and_then(|e| match held(e.1) {
                Some(Value::StringValue(s)) => Some(s.clone()),
                Some(Value::BytesValue(bytes)) => Some(bytes_text(bytes)),
                _ => None,
            });
        resource_values.add_row(&entries);

        for ss in &rs.scope_spans {
            let scope = ss.scope.as_ref().map_or("", |s| s.name.as_str());
            for s in &ss.spans {
                if !check(s, &mut rejections) {
                    continue;
                }
                let (start, end) = (s.start_time_unix_nano, s.end_time_unix_nano);
                let (trace_id, span_id) = (hex(&s.trace_id), hex(&s.span_id));
                c.trace_id.append_value(&trace_id);
                c.span_id.append_value(&span_id);
                if s.parent_span_id.is_empty() || s.parent_span_id.iter().all(|&b| b == 0) {
                    c.parent_span_id.append_null();
                } else {
                    c.parent_span_id.append_value(hex(&s.parent_span_id));
                }
                c.name.append_value(&s.name);
                c.kind.append_value(
                    usize::try_from(s.kind)
                        .ok()
                        .and_then(|k| SPAN_KINDS.get(k))
                        .unwrap_or(&"UNSPECIFIED"),
                );
                // Checked above: both below 2^63.
                c.start.push(start as i64);
                c.end.push(end as i64);
                c.duration_ms.append_value((end - start) as f64 / 1e6);
                let status = s.status.as_ref();
                let code = status.map_or(0, |st| st.code);
                c.status_code.append_value(
                    usize::try_from(code)
                        .ok()
                        .and_then(|k| STATUS_CODES.get(k))
                        .unwrap_or(&"UNSET"),
                );
                optional(
                    &mut c.status_message,
                    status.map_or("", |st| st.message.as_str()),
                );
                match &service {
                    Some(name) => c.service_name.append_value(name),
                    None => c.service_name.append_null(),
                }
                optional(&mut c.scope_name, scope);

                let attrs = unique_entries(&s.attributes, Order::Sorted);
                text.clear();
                text.push(b'{');
                out_text.clear();
                out_text.push(b'{');
                for (key, value) in &attrs {
                    // A key without a value is not gathered, so the split could not tell it was here.
                    if !left_out.is_empty()
                        && left_out.contains(key.as_str())
                        && held(*value).is_some()
                    {
                        write_pair(&mut out_text, key, *value);
                    } else {
                        write_pair(&mut text, key, *value);
                    }
                }
                text.push(b'}');
                c.attributes
                    .append_value(std::str::from_utf8(&text).unwrap_or_default());
                if out_text.len() > 1 {
                    out_text.push(b'}');
                    c.left_out
                        .append_value(std::str::from_utf8(&out_text).unwrap_or_default());
                } else {
                    c.left_out.append_null();
                }
                scores.add(s, &attrs, &trace_id, &span_id, row);
                row += 1;
                span_values.add_row(&attrs);
                c.resource.append_value(&resource_json);

                json_list(&mut c.events, &s.events, &mut text, |t, e| {
                    t.extend_from_slice(b"{\"name\":");
                    write_str(t, &e.name);
                    t.extend_from_slice(b",\"time_unix_nano\":");
                    write_u64(t, e.time_unix_nano);
                    attributes_member(t, &e.attributes);
                });
                json_list(&mut c.links, &s.links, &mut text, |t, l| {
                    t.extend_from_slice(b"{\"trace_id\":");
                    write_str(t, &hex(&l.trace_id));
                    t.extend_from_slice(b",\"span_id\":");
                    write_str(t, &hex(&l.span_id));
                    attributes_member(t, &l.attributes);
                });
                c.resource_index.append_value(resource_index as i32);
            }
        }
    }

    let utc_ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
    let text_field = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let schema = Schema::new(vec![
        text_field("trace_id", false),
        text_field("span_id", false),
        text_field("parent_span_id", true),
        text_field("name", false),
        text_field("kind", false),
        Field::new("start_time", utc_ns.clone(), false),
        Field::new("end_time", utc_ns, false),
        Field::new("duration_ms", DataType::Float64, false),
        text_field("status_code", false),
        text_field("status_message", true),
        text_field("service_name", true),
        text_field("scope_name", true),
        text_field("attributes", false),
        text_field("left_out", true),
        text_field("resource", false),
        text_field("events", true),
        text_field("links", true),
        Field::new("resource_index", DataType::Int32, false),
    ]);
    let spans = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(c.trace_id.finish()),
            Arc::new(c.span_id.finish()),
            Arc::new(c.parent_span_id.finish()),
            Arc::new(c.name.finish()),
            Arc::new(c.kind.finish()),
            Arc::new(PrimitiveArray::<TimestampNanosecondType>::from(c.start)),
            Arc::new(PrimitiveArray::<TimestampNanosecondType>::from(c.end)),
            Arc::new(c.duration_ms.finish()),
            Arc::new(c.status_code.finish()),
            Arc::new(c.status_message.finish()),
            Arc::new(c.service_name.finish()),
            Arc::new(c.scope_name.finish()),
            Arc::new(c.attributes.finish()),
            Arc::new(c.left_out.finish()),
            Arc::new(c.resource.finish()),
            Arc::new(c.events.finish()),
            Arc::new(c.links.finish()),
            Arc::new(c.resource_index.finish()),
        ],
    )?;
    let (span_values, span_json_keys) = span_values.finish()?;
    let (resource_values, resource_json_keys) = resource_values.finish()?;
    let scores_left = std::mem::take(&mut scores.left);
    let (scores, first_tokens) = scores.finish()?;
    Ok(Walked {
        scores,
        first_tokens,
        scores_left,
        spans,
        span_values,
        span_json_keys,
        resource_values,
        resource_json_keys,
        rejections,
    })
}

#[cfg(test)]
mod tests {
    use crate::json::write_f64;

    fn float(v: f64) -> String {
        let mut out = Vec::new();
        write_f64(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_are_written_as_orjson_writes_them() {
        assert_eq!(float(1e20), "1e+20");
        assert_eq!(float(1e-7), "1e-7");
        assert_eq!(float(1e-5), "0.00001");
        assert_eq!(float(1e16), "1e+16");
        assert_eq!(float(123456.0), "123456.0");
        assert_eq!(float(-0.0), "-0.0");
        assert_eq!(float(f64::NAN), "null");
        assert_eq!(float(1.2345678901234567e19), "1.2345678901234567e+19");
    }
}
