-- The hold gauges (wms_outbounds_waiting, wms_outbound_oldest_waiting_age_seconds) read the
-- outbounds held or recalled every interval: a partial index of those.
CREATE INDEX outbounds_waiting_idx ON outbounds (status, updated_at)
    WHERE status IN ('INTERCEPTED', 'RECALL');
