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
    // (numbered from 0 without gaps, up to about twice the peak), never at or above the ceiling of the taker
    // that makes them, and stay.
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
    // the live ones first, and those slots are made: they count against the ceiling as every later lease
    // does (one above a ceiling lower than their number is what the lowered-ceiling rule below is for).
    yield* sql`
      UPDATE capacity_leases l SET slot = n.slot
      FROM (SELECT lease_id,
                   row_number() OVER (PARTITION BY provider_id, model_class
                                      ORDER BY expires_at <= now(), acquired_at, lease_id) - 1 AS slot
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
    // The first slot below `ceiling` with no lease (an expired one still holds its slot until taken over),
    // locked by this transaction to its commit; NULL when there is none.
    yield* sql`
      CREATE FUNCTION capacity_free_slot(p_provider TEXT, p_class TEXT, ceiling INTEGER) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        free_slot INTEGER;
      BEGIN
        SELECT s.slot INTO free_slot FROM capacity_slots s
        WHERE s.provider_id = p_provider AND s.model_class = p_class AND s.slot < ceiling
          -- A scalar subquery, run per slot as one unique-index probe: written NOT EXISTS, the planner may
          -- make it an anti join that reads every lease of the (provider, class) for each slot it looks at.
          AND (SELECT l.lease_id FROM capacity_leases l
               WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot = s.slot) IS NULL
        ORDER BY s.slot LIMIT 1
        FOR UPDATE OF s SKIP LOCKED;
        RETURN free_slot;
      END
      $$
    `
    // The same, among the slots named (random picks), one at a time: each look is two primary-key probes,
    // whatever the planner knows of the tables (as one join or `slot = ANY`, with no statistics yet it read
    // every slot of the (provider, class)).
    yield* sql`
      CREATE FUNCTION capacity_free_slot_of(p_provider TEXT, p_class TEXT, picks INTEGER[]) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        pick INTEGER;
        free_slot INTEGER;
      BEGIN
        FOREACH pick IN ARRAY picks LOOP
          SELECT s.slot INTO free_slot FROM capacity_slots s
          WHERE s.provider_id = p_provider AND s.model_class = p_class AND s.slot = pick
            AND NOT EXISTS (SELECT 1 FROM capacity_leases l
                            WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot = pick)
          FOR UPDATE SKIP LOCKED;
          IF free_slot IS NOT NULL THEN
            RETURN free_slot;
          END IF;
        END LOOP;
        RETURN NULL;
      END
      $$
    `
    // The same contract as migration 0007's (true: taken; false: at the ceiling), without the advisory lock
    // that made every taker of the (provider, class) wait for the one before it to commit. A free slot is a
    // slot row below the ceiling with no lease that no other taker has locked (SKIP LOCKED). A look probes 8
    // slots picked at random among those made (one index probe each: picks spread the leases evenly, where
    // a scan from a random start packed them into a run that later scans had to cross); at the ceiling it
    // then reads them all, to say false truly. With no free slot seen and room below the ceiling, as many
    // slots again as are made, and 64 more, are made (doubling: after it about half the slots are free, so 8
    // picks all miss about once in 250 looks; a burst meets a handful of such steps, and only a taker making
    // the same numbers at that moment waits, for the other's commit) and it looks again. Before making slots
    // (or answering false) an expired lease's slot is taken over, its lease row and slot row locked with
    // SKIP LOCKED, so a release in progress is never waited for. The
    // lease is inserted on its slot once a fresh look, with the slot locked, finds no lease there (one
    // committed since the first look sends it to look again), so the insert never waits. While a live lease
    // holds a slot at or above the ceiling (the quote's ceiling was lowered under it) or none (one taken by
    // the old function while this migration ran), takers count as 0007 did, one at a time under its
    // advisory lock, and still take a slot below the ceiling; a taker that saw no such lease needs no count,
    // as no taker under this ceiling makes one.
    yield* sql`
      CREATE OR REPLACE FUNCTION acquire_capacity(p_provider TEXT, p_class TEXT, p_capacity INTEGER, p_lease TEXT,
                                                  p_ttl INTERVAL) RETURNS BOOLEAN
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        top INTEGER;
        free_slot INTEGER;
        in_use INTEGER;
        taken BOOLEAN;
      BEGIN
        IF p_capacity <= 0 THEN
          RETURN false;
        END IF;
        -- Two index range reads, each empty in steady state (one OR of both would read every lease).
        IF EXISTS (SELECT 1 FROM capacity_leases
                   WHERE provider_id = p_provider AND model_class = p_class AND slot >= p_capacity
                     AND expires_at > now())
           OR EXISTS (SELECT 1 FROM capacity_leases
                      WHERE provider_id = p_provider AND model_class = p_class AND slot IS NULL
                        AND expires_at > now()) THEN
          PERFORM pg_advisory_xact_lock(hashtextextended(p_provider || '|' || p_class, 7402));
          SELECT count(*) INTO in_use FROM capacity_leases
          WHERE provider_id = p_provider AND model_class = p_class AND expires_at > now();
          IF in_use >= p_capacity THEN
            RETURN false;
          END IF;
        END IF;
        FOR attempt IN 1..1000 LOOP
          -- The highest slot made below the ceiling: one backward index probe (max() may be read as a scan).
          SELECT slot INTO top FROM capacity_slots
          WHERE provider_id = p_provider AND model_class = p_class AND slot < p_capacity
          ORDER BY slot DESC LIMIT 1;
          free_slot := NULL;
          IF top IS NOT NULL THEN
            free_slot := capacity_free_slot_of(p_provider, p_class,
                                               ARRAY(SELECT floor(random() * (top + 1))::integer
                                                     FROM generate_series(1, 8)));
            -- At the ceiling, every slot is read before the answer is false.
            IF free_slot IS NULL AND top + 1 >= p_capacity THEN
              free_slot := capacity_free_slot(p_provider, p_class, p_capacity);
            END IF;
            IF free_slot IS NULL THEN
              -- An expired lease's slot (a lease its request never released), before any slot is made, if
              -- neither the lease nor its slot is held by another.
              SELECT l.slot INTO free_slot FROM capacity_leases l
              JOIN capacity_slots s
                ON s.provider_id = l.provider_id AND s.model_class = l.model_class AND s.slot = l.slot
              WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot < p_capacity
                AND l.expires_at <= now()
              LIMIT 1
              FOR UPDATE SKIP LOCKED;
              IF free_slot IS NOT NULL THEN
                DELETE FROM capacity_leases
                WHERE provider_id = p_provider AND model_class = p_class AND slot = free_slot;
              ELSIF top + 1 >= p_capacity THEN
                RETURN false;
              END IF;
            END IF;
          END IF;
          IF free_slot IS NULL THEN
            INSERT INTO capacity_slots (provider_id, model_class, slot)
            SELECT p_provider, p_class, g
            FROM generate_series(coalesce(top, -1) + 1,
                                 least(p_capacity, 2 * (coalesce(top, -1) + 1) + 64) - 1) g
            ON CONFLICT DO NOTHING;
            CONTINUE;
          END IF;
          -- With its slot locked, no other lease can land there, so this fresh look sees every lease on it:
          -- one committed since the first look (or being released) sends it to look again, and the insert
          -- meets no row, so it never waits.
          IF EXISTS (SELECT 1 FROM capacity_leases
                     WHERE provider_id = p_provider AND model_class = p_class AND slot = free_slot) THEN
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
