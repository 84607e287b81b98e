-- beatless: the PostgreSQL claim store's tables and functions, schema version 2.
--
-- Run by the store, in one transaction holding an advisory lock on the schema's name,
-- with search_path set to the store's schema (default "beatless"): every name below is
-- created there, and each function keeps that search_path (SET search_path FROM
-- CURRENT), so a caller's own search_path changes nothing. Every statement is
-- idempotent: a node that finds the schema at an older version, or missing a function,
-- runs the whole file again. The caller then writes the version row.
--
-- Times are epoch milliseconds on the server's clock, clock_timestamp(), read once at
-- the start of each function call. Each function's last argument, p_now_ms, is NULL
-- but in tests, which pass the reading of a clock they move by hand instead. Identifiers
-- are compared in the "C" collation, and every claim function locks rows in that order
-- of (namespace, id), so that two calls never wait on each other in a cycle (post_v1,
-- the only one that writes notes, orders its own locks; see there). A commit that
-- carries notes is one statement that calls commit_v1, then post_v1 on its row: one
-- transaction, whose notes' locks come after all its claims' locks.
--
-- Versions: 1 had claim_v1; 2 replaced it with claim_v2, which also takes the run-lease
-- record of each firing (the OVERLAP outcome); tables, commit_v1 and release_v1 are
-- unchanged. A schema brought up from version 1 keeps claim_v1, unused, so that a node
-- of the older beatless that opened it before the upgrade goes on claiming until it
-- reconnects (it then refuses the newer version). The notes table with post_v1 came
-- later within version 2: a schema without them is missing a function, so the next node
-- runs this file again and gains them in place; a beatless that does not know notes
-- never touches them, and uses the schema as before. claim_v3 came later within version
-- 2 too, in the same way: claim_v2 with p_hold_off (re-seeding), which claim_v2 now calls;
-- and claim_v4 after it: claim_v3 with live checks (the S outcome), which claim_v3 calls;
-- and claim_v5: claim_v4 that keeps each claim's live revision in the column revision of
-- claims (added in place, nullable), which claim_v4 now calls with none. A beatless that
-- calls claim_v4 writes NULL there (not recorded) and never reads the column.

CREATE TABLE IF NOT EXISTS version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version integer NOT NULL
);

-- One row per namespace: the identity of the store's memory for that namespace. Written
-- by the first claim that finds it absent; a dropped schema (or a deleted row) means a
-- new token, and every store object that saw the old one reports what it may have lost.
CREATE TABLE IF NOT EXISTS epochs (
    namespace text COLLATE "C" PRIMARY KEY,
    token text NOT NULL,
    started_ms bigint NOT NULL
);

-- One row per claim. format: the row's layout version (1); a row of any other format
-- fails its firing as corrupt and is never overwritten. committed: false while pending.
-- until_ms: the end of the lease (pending) or of the memory (committed), inclusive.
-- forget_ms: when the row may be deleted, never before until_ms + memory_ms for a
-- pending claim (so that a claim taken over after its lease ran out is still reported
-- as a takeover) nor before until_ms for a committed one. A claim sets it to the end of
-- its lease + memory_ms; commit and release leave it as it is whenever that is enough
-- (a committed claim is then kept up to one lease longer than its memory), so that they
-- change no indexed column and PostgreSQL can update the row in place (HOT).
CREATE TABLE IF NOT EXISTS claims (
    until_ms bigint NOT NULL,
    forget_ms bigint NOT NULL,
    memory_ms bigint NOT NULL,
    claimed_ms bigint NOT NULL,
    occurrence_ms bigint NOT NULL,
    format smallint NOT NULL,
    committed boolean NOT NULL,
    namespace text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    tag text NOT NULL,
    node text NOT NULL,
    address text NOT NULL,
    PRIMARY KEY (namespace, id)
) WITH (fillfactor = 80);
CREATE INDEX IF NOT EXISTS claims_forget_ms ON claims (forget_ms);
-- The live revision the claim carried (the last renewal's); NULL: none, or not recorded.
-- Added only where it is missing: ALTER TABLE locks the table against every claim even
-- when it changes nothing, and this file runs again while other nodes claim.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'claims'::regclass
            AND attname = 'revision' AND NOT attisdropped) THEN
        ALTER TABLE claims ADD COLUMN revision bigint;
    END IF;
END $$;

-- One row per note: what nodes show each other beside their claims (the registry, the
-- history, the controls), keyed by namespace, kind and key. A kind or key may be up to
-- 1000 characters, longer than a btree entry may hold, so the key is their SHA-256
-- digests (kind_id, key_id, from the UTF-8 text) and the text is kept beside them; the
-- value is the UTF-8 bytes, as text cannot hold a NUL. until_ms: the note's last
-- millisecond on the server's clock, inclusive; a row past it is never read and is
-- deleted by a later post.
CREATE TABLE IF NOT EXISTS notes (
    until_ms bigint NOT NULL,
    namespace text COLLATE "C" NOT NULL,
    kind_id bytea NOT NULL,
    key_id bytea NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (namespace, kind_id, key_id)
);
CREATE INDEX IF NOT EXISTS notes_until_ms ON notes (until_ms);

-- claim_v5: judge and write a batch of claims; one call is one transaction.
--
-- Each request is judged by the contract's rules (beatless/stores/base.py), in the
-- order of its id (then its place in the batch), against the row as it stands once
-- locked. Returns one letter per request, in request order: W won, T takeover, L lost,
-- H held, X late, E early, S stale, F forgotten, R re-seeding, C corrupt, A foreign, O overlap;
-- and the namespace's epoch (written now if absent). p_seen is the epoch token the caller
-- last saw ('' if none); when the epoch is another, the horizon is its start +
-- p_tolerance_ms, else p_horizon (NULL: none): a firing nobody holds and released before
-- the horizon is written committed and answered F, or, with p_hold_off (a caller that
-- re-seeds, see base.py "Re-seeding"), answered R with nothing written. A node that
-- claims its own live pending claim gets
-- W and its lease renewed: it runs p_lease_ms from now.
--
-- p_run_ids holds, per request, the id of its address's run-lease record ('' for none).
-- A claim that would be won (W or T) while that record is a live pending claim of any
-- node is written committed for its memory instead and answered O. The record is read
-- right before the write, by primary key and without a lock (a plain read, which in
-- READ COMMITTED sees every claim committed before it): locking it would make the
-- workers' heartbeats on it wait for a scheduler's whole batch, and would take a lock
-- out of the batch's id order. A worker's claim of it that commits after the read is
-- ordered after this call, and the worker's own run-lease check refuses an overlapping
-- run. A record of another format is not a run in progress.
--
-- p_lives holds, per request, the number of its live check among p_live_kinds and
-- p_live_keys (0 or NULL: none): the kept note of its namespace's revisions holding the
-- revision after the claim's own (beatless/stores/_fences.py). When that note exists
-- and the first "fence_ms": of its value is at or before the request's occurrence (none:
-- stale), a claim that would be won or renewed is answered S and nothing is written; a
-- live claim of another node decides first, and late and early come before it.
--
-- p_revisions holds, per request, the live revision it carries (NULL: none): every row
-- a request writes (won, renewed, taken over, forgotten, overlap) keeps it in revision.
--
-- Afterwards, at most p_sweep rows past their forget_ms are deleted, skipping rows
-- another call has locked.
CREATE OR REPLACE FUNCTION claim_v5(
    p_namespace text, p_node text, p_lease_ms bigint, p_tolerance_ms bigint,
    p_seen text, p_horizon bigint, p_new_token text, p_sweep integer,
    p_ids text[], p_addresses text[], p_occurrences bigint[], p_max_lates bigint[],
    p_memories bigint[], p_releases bigint[], p_tags text[], p_run_ids text[],
    p_lives integer[], p_live_kinds bytea[], p_live_keys bytea[], p_revisions bigint[],
    p_hold_off boolean, p_now_ms bigint
) RETURNS TABLE (outcomes text, epoch_token text, epoch_started_ms bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    now_ms bigint := coalesce(p_now_ms, floor(extract(epoch FROM clock_timestamp()) * 1000));
    forgot_before bigint := p_horizon;
    letters text[] := array_fill(''::text, ARRAY[cardinality(p_ids)]);
    r record;
    h claims%ROWTYPE;
    letter text;
    tries integer;
    fences bigint[] := '{}';
    fence bigint;
    stale boolean;
BEGIN
    FOR j IN 1 .. coalesce(cardinality(p_live_kinds), 0) LOOP
        SELECT coalesce(substring(convert_from(k.value, 'UTF8') FROM '"fence_ms":(-?[0-9]+)')
                ::bigint, -9223372036854775807) INTO fence
            FROM kept_notes k WHERE k.namespace = p_namespace AND k.kind_id = p_live_kinds[j]
                AND k.key_id = p_live_keys[j];
        fences[j] := fence;
    END LOOP;
    SELECT e.token, e.started_ms INTO epoch_token, epoch_started_ms
        FROM epochs e WHERE e.namespace = p_namespace;
    IF NOT FOUND THEN
        INSERT INTO epochs (namespace, token, started_ms)
            VALUES (p_namespace, p_new_token, now_ms) ON CONFLICT DO NOTHING;
        SELECT e.token, e.started_ms INTO epoch_token, epoch_started_ms
            FROM epochs e WHERE e.namespace = p_namespace;
    END IF;
    IF p_seen <> '' AND epoch_token <> p_seen THEN
        forgot_before := epoch_started_ms + p_tolerance_ms;
    END IF;

    FOR r IN
        SELECT q.* FROM unnest(p_ids, p_addresses, p_occurrences, p_max_lates, p_memories,
            p_releases, p_tags, p_run_ids, p_lives, p_revisions) WITH ORDINALITY
            AS q(id, address, occurrence_ms, max_late_ms, memory_ms, release_ms, tag, run_id,
                live, revision, ord)
        ORDER BY q.id COLLATE "C", q.ord
    LOOP
        tries := 0;
        stale := coalesce(r.live > 0 AND r.occurrence_ms >= fences[r.live], false);
        LOOP
            tries := tries + 1;
            IF tries > 3 THEN
                RAISE EXCEPTION 'beatless: claim of % kept changing under the lock', r.id;
            END IF;
            -- As if nobody held it: late, early, forgotten, overlap or a first win. A win
            -- is written at once if the row is absent, which is the common case.
            IF now_ms - r.occurrence_ms > r.max_late_ms + p_tolerance_ms THEN
                letter := 'X';
            ELSIF r.release_ms - now_ms > p_tolerance_ms THEN
                letter := 'E';
            ELSIF stale THEN
                -- Stale: nothing written, if no row stands there.
                letter := 'S';
                EXIT WHEN NOT EXISTS (SELECT FROM claims c
                    WHERE c.namespace = p_namespace AND c.id = r.id);
            ELSE
                IF forgot_before IS NOT NULL AND r.release_ms < forgot_before THEN
                    letter := CASE WHEN p_hold_off THEN 'R' ELSE 'F' END;
                ELSIF r.run_id <> '' AND EXISTS (SELECT FROM claims c
                        WHERE c.namespace = p_namespace AND c.id = r.run_id AND c.format = 1
                            AND NOT c.committed AND c.until_ms >= now_ms) THEN
                    letter := 'O';
                ELSE
                    letter := 'W';
                END IF;
                -- Held off: nothing written, if no row stands there.
                EXIT WHEN letter = 'R' AND NOT EXISTS (SELECT FROM claims c
                    WHERE c.namespace = p_namespace AND c.id = r.id);
                -- Won: pending for the lease; forgotten or overlap: committed for memory.
                IF letter <> 'R' THEN
                    INSERT INTO claims (until_ms, forget_ms, memory_ms, claimed_ms,
                        occurrence_ms, format, committed, namespace, id, tag, node, address,
                        revision)
                        VALUES (
                        now_ms + CASE WHEN letter = 'W' THEN p_lease_ms ELSE r.memory_ms END,
                        now_ms + r.memory_ms + CASE WHEN letter = 'W' THEN p_lease_ms ELSE 0 END,
                        r.memory_ms, now_ms, r.occurrence_ms, 1, letter <> 'W', p_namespace,
                        r.id, r.tag, p_node, r.address, r.revision)
                        ON CONFLICT DO NOTHING;
                    EXIT WHEN FOUND;
                END IF;
            END IF;
            -- A row stands there (or a late or early firing's may): judge it, locked.
            SELECT * INTO h FROM claims c
                WHERE c.namespace = p_namespace AND c.id = r.id FOR UPDATE;
            IF NOT FOUND THEN
                -- Late or early with no row: refused, nothing written. Otherwise the
                -- row went between the insert and the look: try again.
                EXIT WHEN letter IN ('X', 'E', 'S');
                CONTINUE;
            ELSIF h.format <> 1 THEN
                letter := 'C';
            ELSIF h.until_ms >= now_ms THEN
                -- A live claim decides first.
                IF h.tag <> r.tag AND h.tag <> '' AND r.tag <> '' THEN
                    letter := 'A';
                ELSIF h.committed THEN
                    letter := 'L';
                ELSIF h.node = p_node AND stale THEN
                    letter := 'S';  -- the holder's own pending claim, left as it is
                ELSIF h.node = p_node THEN
                    -- The holder's own pending claim: renewed, p_lease_ms from now.
                    letter := 'W';
                    UPDATE claims c SET until_ms = now_ms + p_lease_ms,
                        forget_ms = now_ms + p_lease_ms + r.memory_ms,
                        memory_ms = r.memory_ms, tag = r.tag, revision = r.revision
                        WHERE c.namespace = p_namespace AND c.id = r.id;
                ELSE
                    letter := 'H';
                END IF;
            ELSIF letter IN ('X', 'E', 'S') THEN
                NULL;  -- a record whose lease or memory ran out refuses nothing itself
            ELSIF r.run_id <> '' AND EXISTS (SELECT FROM claims c
                    WHERE c.namespace = p_namespace AND c.id = r.run_id AND c.format = 1
                        AND NOT c.committed AND c.until_ms >= now_ms) THEN
                -- Free, but a run of the address is in progress: written committed.
                letter := 'O';
                UPDATE claims c SET until_ms = now_ms + r.memory_ms,
                    forget_ms = greatest(c.forget_ms, now_ms + r.memory_ms),
                    memory_ms = r.memory_ms, claimed_ms = now_ms,
                    occurrence_ms = r.occurrence_ms, committed = true, tag = r.tag,
                    node = p_node, address = r.address, revision = r.revision
                    WHERE c.namespace = p_namespace AND c.id = r.id;
            ELSE
                -- A record whose lease or memory ran out: free, whatever its tag; a win
                -- after it is never forgotten, and after a pending one is a takeover.
                letter := CASE WHEN h.committed THEN 'W' ELSE 'T' END;
                UPDATE claims c SET until_ms = now_ms + p_lease_ms,
                    forget_ms = now_ms + p_lease_ms + r.memory_ms, memory_ms = r.memory_ms,
                    claimed_ms = now_ms, occurrence_ms = r.occurrence_ms, committed = false,
                    tag = r.tag, node = p_node, address = r.address, revision = r.revision
                    WHERE c.namespace = p_namespace AND c.id = r.id;
            END IF;
            EXIT;
        END LOOP;
        letters[r.ord] := letter;
    END LOOP;

    -- Last, so that it never waits while holding the claims' locks out of order.
    IF p_sweep > 0 THEN
        DELETE FROM claims WHERE ctid = ANY (ARRAY(
            SELECT c.ctid FROM claims c WHERE c.forget_ms < now_ms
                ORDER BY c.forget_ms LIMIT p_sweep FOR UPDATE SKIP LOCKED));
    END IF;
    outcomes := array_to_string(letters, '');
    RETURN NEXT;
END
$$;

-- claim_v4: claim_v5 without revisions (the function an earlier beatless calls).
CREATE OR REPLACE FUNCTION claim_v4(
    p_namespace text, p_node text, p_lease_ms bigint, p_tolerance_ms bigint,
    p_seen text, p_horizon bigint, p_new_token text, p_sweep integer,
    p_ids text[], p_addresses text[], p_occurrences bigint[], p_max_lates bigint[],
    p_memories bigint[], p_releases bigint[], p_tags text[], p_run_ids text[],
    p_lives integer[], p_live_kinds bytea[], p_live_keys bytea[],
    p_hold_off boolean, p_now_ms bigint
) RETURNS TABLE (outcomes text, epoch_token text, epoch_started_ms bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT * FROM claim_v5(p_namespace, p_node, p_lease_ms, p_tolerance_ms, p_seen,
        p_horizon, p_new_token, p_sweep, p_ids, p_addresses, p_occurrences, p_max_lates,
        p_memories, p_releases, p_tags, p_run_ids, p_lives, p_live_kinds, p_live_keys,
        array_fill(NULL::bigint, ARRAY[coalesce(cardinality(p_ids), 0)]), p_hold_off, p_now_ms)
$$;

-- claim_v3: claim_v4 without live checks (the function an earlier beatless calls).
CREATE OR REPLACE FUNCTION claim_v3(
    p_namespace text, p_node text, p_lease_ms bigint, p_tolerance_ms bigint,
    p_seen text, p_horizon bigint, p_new_token text, p_sweep integer,
    p_ids text[], p_addresses text[], p_occurrences bigint[], p_max_lates bigint[],
    p_memories bigint[], p_releases bigint[], p_tags text[], p_run_ids text[],
    p_hold_off boolean, p_now_ms bigint
) RETURNS TABLE (outcomes text, epoch_token text, epoch_started_ms bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT * FROM claim_v4(p_namespace, p_node, p_lease_ms, p_tolerance_ms, p_seen,
        p_horizon, p_new_token, p_sweep, p_ids, p_addresses, p_occurrences, p_max_lates,
        p_memories, p_releases, p_tags, p_run_ids, '{}', '{}', '{}', p_hold_off, p_now_ms)
$$;

-- claim_v2: claim_v3 without holding off (the function an earlier beatless calls).
CREATE OR REPLACE FUNCTION claim_v2(
    p_namespace text, p_node text, p_lease_ms bigint, p_tolerance_ms bigint,
    p_seen text, p_horizon bigint, p_new_token text, p_sweep integer,
    p_ids text[], p_addresses text[], p_occurrences bigint[], p_max_lates bigint[],
    p_memories bigint[], p_releases bigint[], p_tags text[], p_run_ids text[],
    p_now_ms bigint
) RETURNS TABLE (outcomes text, epoch_token text, epoch_started_ms bigint)
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT * FROM claim_v3(p_namespace, p_node, p_lease_ms, p_tolerance_ms, p_seen,
        p_horizon, p_new_token, p_sweep, p_ids, p_addresses, p_occurrences, p_max_lates,
        p_memories, p_releases, p_tags, p_run_ids, false, p_now_ms)
$$;

-- commit_v1: make this node's live claims committed, remembered for their memory_ms
-- from now. Returns one '1' per id that was this node's (now committed), '0' for any
-- other, in request order, and the namespace's epoch (NULL if none): read only. Each id
-- is one lookup by primary key, in id order, so the cost follows the batch, not the
-- table.
CREATE OR REPLACE FUNCTION commit_v1(
    p_namespace text, p_node text, p_ids text[], p_now_ms bigint
)
RETURNS TABLE (flags text, epoch_token text, epoch_started_ms bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    now_ms bigint := coalesce(p_now_ms, floor(extract(epoch FROM clock_timestamp()) * 1000));
    letters text[] := array_fill('0'::text, ARRAY[cardinality(p_ids)]);
    r record;
BEGIN
    FOR r IN
        SELECT q.id, q.ord FROM unnest(p_ids) WITH ORDINALITY AS q(id, ord)
        ORDER BY q.id COLLATE "C", q.ord
    LOOP
        UPDATE claims c SET committed = true, until_ms = now_ms + c.memory_ms,
            forget_ms = greatest(c.forget_ms, now_ms + c.memory_ms)
            WHERE c.namespace = p_namespace AND c.id = r.id AND c.node = p_node
                AND c.format = 1 AND c.until_ms >= now_ms;
        IF FOUND THEN
            letters[r.ord] := '1';
        END IF;
    END LOOP;
    flags := array_to_string(letters, '');
    SELECT e.token, e.started_ms INTO epoch_token, epoch_started_ms
        FROM epochs e WHERE e.namespace = p_namespace;
    RETURN NEXT;
END
$$;

-- release_v1: end this node's pending claims now. A released claim is kept with its
-- lease ended (until_ms = now - 1) and forgotten memory_ms later, as a pending claim
-- whose lease ran out is, so that the next claim that is not late is a takeover.
-- Committed claims, other nodes' claims and rows of another format are left alone.
CREATE OR REPLACE FUNCTION release_v1(
    p_namespace text, p_node text, p_ids text[], p_now_ms bigint
)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    now_ms bigint := coalesce(p_now_ms, floor(extract(epoch FROM clock_timestamp()) * 1000));
    r record;
BEGIN
    FOR r IN SELECT DISTINCT q.id COLLATE "C" AS id FROM unnest(p_ids) AS q(id) ORDER BY 1 LOOP
        UPDATE claims c SET until_ms = least(c.until_ms, now_ms - 1),
            forget_ms = greatest(c.forget_ms, least(c.until_ms, now_ms - 1) + c.memory_ms)
            WHERE c.namespace = p_namespace AND c.id = r.id AND c.node = p_node
                AND c.format = 1 AND NOT c.committed;
    END LOOP;
END
$$;

-- post_v1: write a batch of notes, then bound their kinds; one call is one transaction.
--
-- Each note lives until now + its ttl, inclusive, replacing the note of the same kind and
-- key (the last of the batch, if the batch names one twice). Then, for each kind with a
-- note whose keep is positive (the last such note's keep), only the keep notes of the
-- kind that expire last are left. Calls that post to the same kind take turns, on a
-- transaction-scoped advisory lock per schema, namespace and kind, all taken in one
-- order before any row: the bound is then exact, and two calls never wait on each
-- other in a cycle. Last, at most p_sweep notes past their time, of any namespace and
-- kind, are deleted, skipping rows another call has locked (that sweep waits for no
-- one), so that the notes of abandoned kinds go too.
CREATE OR REPLACE FUNCTION post_v1(
    p_namespace text, p_kind_ids bytea[], p_key_ids bytea[], p_kinds text[], p_keys text[],
    p_values bytea[], p_ttls bigint[], p_keeps integer[], p_sweep integer, p_now_ms bigint
)
RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    now_ms bigint := coalesce(p_now_ms, floor(extract(epoch FROM clock_timestamp()) * 1000));
    lock_key bigint;
    b record;
BEGIN
    FOR lock_key IN
        SELECT DISTINCT hashtextextended(
            concat_ws('/', current_schema(), p_namespace, encode(k.kind_id, 'hex')), 0)
        FROM unnest(p_kind_ids) AS k(kind_id) ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;

    INSERT INTO notes AS n (until_ms, namespace, kind_id, key_id, kind, key, value)
        SELECT DISTINCT ON (q.kind_id, q.key_id) now_ms + q.ttl_ms, p_namespace, q.kind_id,
            q.key_id, q.kind, q.key, q.value
        FROM unnest(p_kind_ids, p_key_ids, p_kinds, p_keys, p_values, p_ttls) WITH ORDINALITY
            AS q(kind_id, key_id, kind, key, value, ttl_ms, ord)
        ORDER BY q.kind_id, q.key_id, q.ord DESC
        ON CONFLICT (namespace, kind_id, key_id)
            DO UPDATE SET until_ms = excluded.until_ms, value = excluded.value;

    FOR b IN
        SELECT DISTINCT ON (q.kind_id) q.kind_id, q.keep
        FROM unnest(p_kind_ids, p_keeps) WITH ORDINALITY AS q(kind_id, keep, ord)
        WHERE q.keep > 0
        ORDER BY q.kind_id, q.ord DESC
    LOOP
        DELETE FROM notes WHERE ctid = ANY (ARRAY(
            SELECT n.ctid FROM notes n
                WHERE n.namespace = p_namespace AND n.kind_id = b.kind_id
                ORDER BY n.until_ms DESC OFFSET b.keep));
    END LOOP;

    IF p_sweep > 0 THEN
        DELETE FROM notes WHERE ctid = ANY (ARRAY(
            SELECT n.ctid FROM notes n WHERE n.until_ms < now_ms
                ORDER BY n.until_ms LIMIT p_sweep FOR UPDATE SKIP LOCKED));
    END IF;
END
$$;

-- One row per kept note (beatless.stores.base.KeptNote): a note with no end, replaced or
-- deleted only, such as the live entries of a schedule and their revisions. Keyed as
-- notes are (the SHA-256 digests of kind and key, the text beside them, the value as
-- UTF-8 bytes). Added within version 2 with keep_v1: a schema without it is missing a
-- function, so the next node runs this file again and gains them in place.
CREATE TABLE IF NOT EXISTS kept_notes (
    namespace text COLLATE "C" NOT NULL,
    kind_id bytea NOT NULL,
    key_id bytea NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (namespace, kind_id, key_id)
);

-- keep_v1: write a batch of kept notes, each replacing the kept note of the same kind
-- and key (the last of the batch, if the batch names one twice); one call is one
-- transaction.
CREATE OR REPLACE FUNCTION keep_v1(
    p_namespace text, p_kind_ids bytea[], p_key_ids bytea[], p_kinds text[], p_keys text[],
    p_values bytea[]
)
RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    INSERT INTO kept_notes AS n (namespace, kind_id, key_id, kind, key, value)
        SELECT DISTINCT ON (q.kind_id, q.key_id) p_namespace, q.kind_id, q.key_id, q.kind,
            q.key, q.value
        FROM unnest(p_kind_ids, p_key_ids, p_kinds, p_keys, p_values) WITH ORDINALITY
            AS q(kind_id, key_id, kind, key, value, ord)
        ORDER BY q.kind_id, q.key_id, q.ord DESC
        ON CONFLICT (namespace, kind_id, key_id) DO UPDATE SET value = excluded.value;
$$;

-- The latest timeline of the server any node of a namespace saw: a standby promoted by a
-- failover starts a new timeline, and keeps the rows of this table it replicated, so a
-- node that starts on it (and never saw the old timeline itself) still finds the change.
-- Added within version 2 with timeline_v1 (see kept_notes).
CREATE TABLE IF NOT EXISTS timelines (
    namespace text COLLATE "C" PRIMARY KEY,
    timeline bigint NOT NULL
);

-- timeline_v1: record p_timeline as the namespace's latest (never lowering it) and
-- return the timeline recorded before, NULL if none.
CREATE OR REPLACE FUNCTION timeline_v1(p_namespace text, p_timeline bigint)
RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    before bigint;
BEGIN
    SELECT t.timeline INTO before FROM timelines t WHERE t.namespace = p_namespace FOR UPDATE;
    INSERT INTO timelines AS t (namespace, timeline) VALUES (p_namespace, p_timeline)
        ON CONFLICT (namespace) DO UPDATE SET timeline = greatest(t.timeline, excluded.timeline);
    RETURN before;
END;
$$;
