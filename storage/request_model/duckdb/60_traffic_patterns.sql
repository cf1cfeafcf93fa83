-- `request_traffic_patterns_between(t0, t1)`: each request that ended in [t0, t1) with the traffic pattern the
-- traffic_pattern detector labelled its arrival with, and the label's signal and window.
--
-- A request's pattern depends only on its deployment, its arrival second and its replica_count, so the labels
-- are stored once per such key (`traffic_pattern_labels`: a day is ~170k rows, not ten million) and joined
-- back to the requests here.
CREATE OR REPLACE MACRO request_traffic_patterns_between(t0, t1) AS TABLE
    SELECT l.window_start, l.window_end, l.pattern, l.signal, r.*
    FROM llm_requests_between(t0, t1) AS r
    JOIN traffic_pattern_labels AS l
      ON l.deployment IS NOT DISTINCT FROM r.deployment
     AND l.arrival_second = date_trunc('second', r.start_time)
     AND l.replica_count IS NOT DISTINCT FROM r.replica_count
     AND r.end_time >= l.window_start AND r.end_time < l.window_end;

-- Every labelled request, of all stored time.
CREATE OR REPLACE VIEW request_traffic_patterns AS
SELECT * FROM request_traffic_patterns_between('-infinity'::TIMESTAMP, 'infinity'::TIMESTAMP);
