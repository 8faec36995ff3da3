BEGIN;
UPDATE claim_bench.outbox_events SET status = 'sent', published_at = now()
WHERE seq IN (SELECT seq FROM claim_bench.outbox_events
              WHERE status IN ('pending', 'retry') ORDER BY seq LIMIT 100
              FOR UPDATE SKIP LOCKED);
COMMIT;
