-- `llm_request_scores_between(t0, t1)`: every quality score of the requests that ended in [t0, t1), one row per
-- score, keyed by the request's (trace_id, span_id). A score attached to either of the request's spans (the
-- client's or the server's) counts for the request; `scored_span_id` says which.
--
-- A request's scores need only its ids, so they are read from the spans' model (30_span_requests.sql), never
-- through the engine join; and each request's two span ids are unnested into one join with the scores
-- instead of a UNION ALL of two, which computed the pairing twice and ran out of DuckDB's default memory on a
-- day of requests.
CREATE OR REPLACE MACRO llm_request_scores_between(t0, t1) AS TABLE
    WITH r AS (
        SELECT trace_id, span_id, unnest([client_span_id, server_span_id]) AS scored_span_id
        FROM llm_span_requests_between(t0, t1)
    )
    SELECT r.trace_id, r.span_id, sc.span_id AS scored_span_id, sc.name, sc.score, sc.label, sc.source,
           sc.observed_at
    FROM r JOIN span_scores AS sc ON sc.trace_id = r.trace_id AND sc.span_id = r.scored_span_id;

-- Every request's scores, of all stored time.
CREATE OR REPLACE VIEW llm_request_scores AS
SELECT * FROM llm_request_scores_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
