-- `slo_status`: the analysts' view of now. Per SLO and group, the latest evaluation's budget left and its burn
-- rate over each of the default rules' windows, one column each (docs/detectors.md, slo_burn).
CREATE OR REPLACE VIEW slo_status AS
-- The latest evaluation of each SLO; every group it evaluated is a row.
WITH latest AS (SELECT slo, max(window_end) AS window_end FROM slo_burn GROUP BY slo)
SELECT b.slo, b.tenant_id, b.deployment, b.model, b.window_end, any_value(b.objective) AS objective,
       any_value(b.budget_remaining) AS budget_remaining, bool_or(b.breached) AS breached,
       any_value(b.severity) AS severity,
       max(b.burn_rate) FILTER (WHERE b.burn_window = '5m') AS burn_5m,
       max(b.burn_rate) FILTER (WHERE b.burn_window = '30m') AS burn_30m,
       max(b.burn_rate) FILTER (WHERE b.burn_window = '1h') AS burn_1h,
       max(b.burn_rate) FILTER (WHERE b.burn_window = '6h') AS burn_6h,
       max(b.burn_rate) FILTER (WHERE b.burn_window = '3d') AS burn_3d
FROM slo_burn AS b JOIN latest USING (slo, window_end)
GROUP BY b.slo, b.tenant_id, b.deployment, b.model, b.window_end;
