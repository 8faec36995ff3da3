WITH claimed AS (
  UPDATE claim_bench.outbox_events SET locked_by = :client_id, locked_until = now() + interval '30 s'
  WHERE seq IN (SELECT seq FROM claim_bench.outbox_events
                WHERE status IN ('pending', 'retry') AND (locked_until IS NULL OR locked_until < now())
                ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED)
  RETURNING seq)
SELECT string_agg(seq::text, ',') AS seqs FROM claimed \gset
UPDATE claim_bench.outbox_events SET status = 'sent', published_at = now(), locked_by = NULL, locked_until = NULL
WHERE seq = ANY(string_to_array(:seqs, ',')::bigint[]) AND locked_by = :client_id;
