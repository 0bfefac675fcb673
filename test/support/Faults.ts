import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * A real database fault, raised by Postgres itself (SQLSTATE 40001, a serialization failure), for one
 * payer's requests only: on `settle`, every capture or release of them (an update that takes the row out
 * of `reserved`; recording its meter still goes through); on `reserve`, every reservation. Returns the
 * effect that lifts the fault.
 */
export const faultFor = (payer: string, on: "settle" | "reserve") =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const name = `fault_${on}_${payer.slice(2, 10)}`
    yield* sql.unsafe(`
      CREATE FUNCTION ${name}() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.payer = '${payer}' ${on === "settle" ? "AND NEW.status <> 'reserved'" : ""} THEN
          RAISE EXCEPTION 'injected fault' USING ERRCODE = 'serialization_failure';
        END IF;
        RETURN NEW;
      END $$`)
    yield* sql.unsafe(
      `CREATE TRIGGER ${name} BEFORE ${on === "settle" ? "UPDATE" : "INSERT"} ON requests FOR EACH ROW EXECUTE FUNCTION ${name}()`
    )
    return sql.unsafe(`DROP TRIGGER ${name} ON requests`).pipe(Effect.asVoid, Effect.orDie)
  }).pipe(Effect.orDie)
