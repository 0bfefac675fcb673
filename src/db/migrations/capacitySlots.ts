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
    // (numbered from 0 without gaps), never beyond the quote's ceiling, and stay.
    yield* sql`
      CREATE TABLE capacity_slots (
        provider_id TEXT NOT NULL,
        model_class TEXT NOT NULL,
        slot INTEGER NOT NULL CHECK (slot >= 0),
        PRIMARY KEY (provider_id, model_class, slot)
      )
    `
    // A lease names its slot; two leases never share one (a lease from before this migration has none).
    // The index also answers "is this slot held", where the old one answered "how many are held".
    yield* sql`ALTER TABLE capacity_leases ADD COLUMN slot INTEGER`
    yield* sql`CREATE UNIQUE INDEX capacity_leases_slot_held ON capacity_leases (provider_id, model_class, slot)`
    yield* sql`DROP INDEX capacity_leases_slot`
    // The same contract as migration 0007's (true: taken; false: at the ceiling), without the advisory lock
    // that made every taker of the (provider, class) wait for the one before it to commit. A free slot is a
    // slot row below the ceiling with no live lease that no other taker has locked (SKIP LOCKED). The look
    // starts at a random slot among those made and reads at most 128 (wrapping), so it finds a free one in a
    // few index probes however many are held; only when that window is full and no slot is left to make
    // does it read them all, to say false truly. With no free slot seen and room below the ceiling, the next
    // 64 slots are made (only a taker making the same numbers at that moment waits, for the other's commit)
    // and it looks again. The lease is inserted on its slot; one committed there after this statement's
    // snapshot makes the insert do nothing and the next look (a new snapshot) passes it over; an expired
    // lease there is taken over. While a live lease holds a slot at or above the ceiling (the quote's
    // ceiling was lowered under it), nothing is taken: the leases on slots below it are unique, so the
    // ceiling holds exactly once those end.
    // The first free slot in [lo, hi), locked by this transaction to its commit; NULL when there is none.
    yield* sql`
      CREATE FUNCTION capacity_free_slot(p_provider TEXT, p_class TEXT, lo INTEGER, hi INTEGER) RETURNS INTEGER
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        free_slot INTEGER;
      BEGIN
        SELECT s.slot INTO free_slot FROM capacity_slots s
        WHERE s.provider_id = p_provider AND s.model_class = p_class AND s.slot >= lo AND s.slot < hi
          AND NOT EXISTS (SELECT 1 FROM capacity_leases l
                          WHERE l.provider_id = p_provider AND l.model_class = p_class AND l.slot = s.slot
                            AND l.expires_at > now())
        ORDER BY s.slot LIMIT 1
        FOR UPDATE OF s SKIP LOCKED;
        RETURN free_slot;
      END
      $$
    `
    yield* sql`
      CREATE OR REPLACE FUNCTION acquire_capacity(p_provider TEXT, p_class TEXT, p_capacity INTEGER, p_lease TEXT,
                                                  p_ttl INTERVAL) RETURNS BOOLEAN
      LANGUAGE plpgsql VOLATILE AS $$
      DECLARE
        top INTEGER;
        first INTEGER;
        free_slot INTEGER;
        taken BOOLEAN;
      BEGIN
        IF EXISTS (SELECT 1 FROM capacity_leases
                   WHERE provider_id = p_provider AND model_class = p_class AND slot >= p_capacity
                     AND expires_at > now()) THEN
          RETURN false;
        END IF;
        FOR attempt IN 1..1000 LOOP
          SELECT max(slot) INTO top FROM capacity_slots
          WHERE provider_id = p_provider AND model_class = p_class AND slot < p_capacity;
          free_slot := NULL;
          IF top IS NOT NULL THEN
            first := floor(random() * (top + 1))::integer;
            free_slot := capacity_free_slot(p_provider, p_class, first, least(first + 128, top + 1));
            IF free_slot IS NULL AND first + 128 > top + 1 THEN
              free_slot := capacity_free_slot(p_provider, p_class, 0, least(first, first + 128 - (top + 1)));
            END IF;
            IF free_slot IS NULL AND top + 1 >= p_capacity THEN
              free_slot := capacity_free_slot(p_provider, p_class, 0, p_capacity);
              IF free_slot IS NULL THEN
                RETURN false;
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
          INSERT INTO capacity_leases AS l (lease_id, provider_id, model_class, expires_at, slot)
          VALUES (p_lease, p_provider, p_class, now() + p_ttl, free_slot)
          ON CONFLICT (provider_id, model_class, slot) DO UPDATE
          SET lease_id = EXCLUDED.lease_id, acquired_at = now(), expires_at = EXCLUDED.expires_at,
              instance_id = EXCLUDED.instance_id
          WHERE l.expires_at <= now()
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
