import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import type { Migrations } from "./Migrations.ts"

/**
 * A capacity lease is taken without a lock every reservation on the (provider, class) queues on (issue 12,
 * docs/decisions.md D541).
 */
export const capacitySlots: Migrations = {
  "0039_capacity_slots": Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    // Numbered slots of a (provider, class): a lease holds one, and a slot is held by one live lease at a
    // time. A taker locks the slot's row (SKIP LOCKED: a slot another taker holds is passed over, not
    // waited for) and keeps it to its commit. The rows are made as the concurrency in flight needs them
    // (numbered from 0 without gaps), never at or above the ceiling of the taker that makes them, and stay.
    yield* sql`
      CREATE TABLE capacity_slots (
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        slot INTEGER NOT NULL CHECK (slot >= 0),
        PRIMARY KEY (provider_id, model_class, slot)
      )
    `
    // A lease names its slot; two leases never share one. The index also answers "is this slot held", where
    // the old one answered "how many are held".
    yield* sql`ALTER TABLE capacity_leases ADD COLUMN slot INTEGER`
    // The leases already there (requests in flight while this runs) get slots 0, 1, … per (provider, class),
    // and those slots are made: they count against the ceiling as every later lease does (one above a
    // ceiling lower than their number is what the lowered-ceiling rule below is for).
    yield* sql`
      UPDATE capacity_leases l SET slot = n.slot
      FROM (SELECT lease_id,
                   row_number() OVER (PARTITION BY provider_id, model_class ORDER BY acquired_at, lease_id) - 1 AS slot
            FROM capacity_leases) n
      WHERE l.lease_id = n.lease_id
    `
    yield* sql`
      INSERT INTO capacity_slots (provider_id, model_class, slot)
      SELECT t.provider_id, t.model_class, g
      FROM (SELECT provider_id, model_class, max(slot) AS top FROM capacity_leases GROUP BY provider_id, model_class) t,
           generate_series(0, t.top) g
    `
    yield* sql`CREATE UNIQUE INDEX capacity_leases_slot_held ON capacity_leases (provider_id, model_class, slot)`
    yield* sql`DROP INDEX capacity_leases_slot`
    // The first slot in [lo, hi) with no lease (an expired one still holds its slot until taken over), locked
    // by this transaction to its commit; NULL when there is none.
    yield* sql`
      CREATE FUNCTION capacity_free_slot(p_provider TEXT, p_class TEXT, lo INTEGER, hi INTEGER) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        free_slot INTEGER;
      BEGIN
        SELECT s.slot INTO free_slot FROM capacity_slots s
        WHERE s.provider_id = p_provider AND s.model_class = p_class AND s.slot >= lo AND s.slot < hi
          AND NOT EXISTS (SELECT 1 FROM capacity_leases l
                          WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot = s.slot)
        ORDER BY s.slot LIMIT 1
        FOR UPDATE OF s SKIP LOCKED;
        RETURN free_slot;
      END
      $$
    `
    // The same contract as migration 0007's (true: taken; false: at the ceiling), without the advisory lock
    // that made every taker of the (provider, class) wait for the one before it to commit. A free slot is a
    // slot row below the ceiling with no live lease that no other taker has locked (SKIP LOCKED). The look
    // starts at a random slot among those made and reads at most 128 (wrapping), so it finds a free one in a
    // few index probes however many are held; only when that window is full and no slot is left to make
    // does it read them all, to say false truly. With no free slot seen and room below the ceiling, the next
    // 64 slots are made (only a taker making the same numbers at that moment waits, for the other's commit)
    // and it looks again. The lease is inserted on the slot; a lease committed there since the look makes the
    // insert do nothing (a committed row: no wait, no lock) and it looks again with a fresh snapshot. An
    // expired lease keeps its slot until a taker at the ceiling takes it over (locking both rows with SKIP
    // LOCKED, so never waiting for a release in progress). While a live lease holds a slot at or above the
    // ceiling (the quote's ceiling was lowered under it), takers count as 0007 did, one at a time under its
    // advisory lock, and still take a slot below the ceiling; a taker that saw no such lease needs no count,
    // as such leases only end.
    yield* sql`
      CREATE OR REPLACE FUNCTION acquire_capacity(p_provider TEXT, p_class TEXT, p_capacity INTEGER, p_lease TEXT,
                                                  p_ttl INTERVAL) RETURNS BOOLEAN
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        top INTEGER;
        first INTEGER;
        free_slot INTEGER;
        in_use INTEGER;
        taken BOOLEAN;
      BEGIN
        IF p_capacity <= 0 THEN
          RETURN false;
        END IF;
        IF EXISTS (SELECT 1 FROM capacity_leases
                   WHERE provider_id = p_provider AND model_class = p_class AND slot >= p_capacity
                     AND expires_at > now()) THEN
          PERFORM pg_advisory_xact_lock(hashtextextended(p_provider || '|' || p_class, 7402));
          SELECT count(*) INTO in_use FROM capacity_leases
          WHERE provider_id = p_provider AND model_class = p_class AND expires_at > now();
          IF in_use >= p_capacity THEN
            RETURN false;
          END IF;
        END IF;
        FOR attempt IN 1..1000 LOOP
          SELECT max(slot) INTO top FROM capacity_slots
          WHERE provider_id = p_provider AND model_class = p_class AND slot < p_capacity;
          free_slot := NULL;
          IF top IS NOT NULL THEN
            first := floor(random() * (top + 1))::integer;
            free_slot := capacity_free_slot(p_provider, p_class, first, least(first + 128, top + 1));
            IF free_slot IS NULL AND first > 0 AND first + 128 > top + 1 THEN
              free_slot := capacity_free_slot(p_provider, p_class, 0, least(first, first + 128 - (top + 1)));
            END IF;
            IF free_slot IS NULL AND top + 1 >= p_capacity THEN
              -- The window read every slot when there are 128 or fewer.
              IF top + 1 > 128 THEN
                free_slot := capacity_free_slot(p_provider, p_class, 0, p_capacity);
              END IF;
              IF free_slot IS NULL THEN
                -- At the ceiling: an expired lease's slot, if neither it nor its slot is held by another.
                SELECT l.slot INTO free_slot FROM capacity_leases l
                JOIN capacity_slots s
                  ON s.provider_id = l.provider_id AND s.model_class = l.model_class AND s.slot = l.slot
                WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot < p_capacity
                  AND l.expires_at <= now()
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF free_slot IS NULL THEN
                  RETURN false;
                END IF;
                DELETE FROM capacity_leases
                WHERE provider_id = p_provider AND model_class = p_class AND slot = free_slot;
              END IF;
            END IF;
          END IF;
          IF free_slot IS NULL THEN
            INSERT INTO capacity_slots (provider_id, model_class, slot)
            SELECT p_provider, p_class, g
            FROM generate_series(coalesce(top, -1) + 1, least(p_capacity, coalesce(top, -1) + 65) - 1) g
            ON CONFLICT DO NOTHING;
            CONTINUE;
          END IF;
          taken := NULL;
          INSERT INTO capacity_leases (lease_id, provider_id, model_class, expires_at, slot)
          VALUES (p_lease, p_provider, p_class, now() + p_ttl, free_slot)
          ON CONFLICT (provider_id, model_class, slot) DO NOTHING
          RETURNING true INTO taken;
          IF taken THEN
            RETURN true;
          END IF;
        END LOOP;
        RAISE WARNING 'acquire_capacity found no slot for % % in 1000 looks', p_provider, p_class;
        RETURN false;
      END
      $$
    `
  })
}
