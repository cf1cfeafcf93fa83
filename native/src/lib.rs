//! Tailwatch's compiled OTLP trace decoder.
//!
//! `walk_traces` parses an ExportTraceServiceRequest with prost (the official message definitions from
//! the opentelemetry-proto crate), validates every span, and hands Python three Arrow record batches
//! through the Arrow C data interface, without copying: the stored span columns, the values of the
//! attribute keys normalization reads (per span, and per resource), and the spans' scores and
//! first-token times from events (src/scores.rs, equal to the Python reference's). Normalization and
//! the final batch are built from these by the same Python code that finishes the reference decoder's
//! walk (collector/span_walk.py), so there is one normalization.

mod json;
mod scores;
mod walk;

// A walk allocates a String or Vec for every key, value and attribute list prost parses, and frees
// them all at its end, on two decoder threads at once: glibc's malloc took a quarter of the walk's
// time (docs/benchmarks.md, "The decoder's allocator"). Only this module's own allocations use it;
// the Arrow buffers it hands Python are freed through their release callbacks, so into it again.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use arrow_array::{Array, RecordBatch, StructArray};
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

/// One record batch, exported once through the Arrow PyCapsule interface (`pyarrow.record_batch(x)`).
#[pyclass(module = "tailwatch_native")]
struct ArrowBatch {
    batch: Option<RecordBatch>,
}

#[pymethods]
impl ArrowBatch {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema; // the batch has the one schema it has
        let batch = self
            .batch
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("the batch was already exported"))?;
        let data = StructArray::from(batch).into_data();
        let schema = FFI_ArrowSchema::try_from(data.data_type())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let array = FFI_ArrowArray::new(&data);
        // pyarrow moves the structs out (clearing `release`); a capsule never consumed releases them.
        let schema = PyCapsule::new_with_value(py, schema, c"arrow_schema")?;
        let array = PyCapsule::new_with_value(py, array, c"arrow_array")?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }
}

fn batch(batch: RecordBatch) -> ArrowBatch {
    ArrowBatch { batch: Some(batch) }
}

type WalkResult = (
    ArrowBatch,
    ArrowBatch,
    Vec<String>,
    ArrowBatch,
    Vec<String>,
    Vec<(&'static str, u64, String)>,
    ArrowBatch,
    ArrowBatch,
    Vec<i32>,
);

/// Walk one serialized ExportTraceServiceRequest.
///
/// `left_out`: attribute keys written to the spans' `left_out` column instead of `attributes`.
/// Returns (spans, span_values, span_json_keys, resource_values, resource_json_keys, rejections, scores,
/// first_tokens, scores_left): the scores with each one's row, the first-token times from events, and the
/// rows whose scores are left to the Python reference (src/scores.rs);
/// raises ValueError when the bytes are not a valid request.
#[pyfunction]
fn walk_traces(
    py: Python<'_>,
    payload: &[u8],
    span_keys: Vec<String>,
    resource_keys: Vec<String>,
    left_out: Vec<String>,
) -> PyResult<WalkResult> {
    // Parsing and walking touch no Python object: other threads run meanwhile.
    let walked = py.detach(|| {
        let request = ExportTraceServiceRequest::decode(payload)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        walk::walk(&request, &span_keys, &resource_keys, &left_out)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    })?;
    Ok((
        batch(walked.spans),
        batch(walked.span_values),
        walked.span_json_keys,
        batch(walked.resource_values),
        walked.resource_json_keys,
        walked.rejections.0,
        batch(walked.scores),
        batch(walked.first_tokens),
        walked.scores_left,
    ))
}

#[pymodule]
fn tailwatch_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ArrowBatch>()?;
    m.add_function(wrap_pyfunction!(walk_traces, m)?)?;
    Ok(())
}
