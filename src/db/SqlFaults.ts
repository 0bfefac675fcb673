import { SqlError } from "effect/sql"
import { ServiceUnavailable } from "../domain/Errors.ts"

/** What Postgres said about a failed statement: its SQLSTATE and, for a constraint, the constraint's name. */
export interface PgFault {
  readonly sqlState: string | undefined
  readonly constraint: string | undefined
}

/**
 * Reads the SQLSTATE and constraint name the driver keeps on the error's cause. Failures are told
 * apart by these (a refusal the schema states, or a database fault), never by matching message text.
 */
export const pgFault = (error: SqlError.SqlError): PgFault => {
  const cause = error.reason.cause as { readonly code?: unknown; readonly constraint?: unknown } | undefined
  return {
    sqlState: typeof cause?.code === "string" ? cause.code : undefined,
    constraint: typeof cause?.constraint === "string" ? cause.constraint : undefined
  }
}

/** A CHECK constraint of the schema refused the statement (SQLSTATE 23514), by its name. */
export const isCheckViolation = (fault: PgFault, constraint: (name: string) => boolean) =>
  fault.sqlState === "23514" && fault.constraint !== undefined && constraint(fault.constraint)

/**
 * A database fault seen by a caller: `503`, retryable. The database could not answer (a lost
 * connection, a serialization or deadlock abort, an admin shutdown, a timeout); the request moved no
 * money and can be sent again.
 */
export const databaseUnavailable = (error?: SqlError.SqlError) =>
  new ServiceUnavailable({
    code: "database_unavailable",
    message: `The router's database could not complete this request${
      error === undefined ? "" : ` (${error.reason._tag}${sqlStateSuffix(error)})`
    }; nothing was charged, retry shortly`
  })

const sqlStateSuffix = (error: SqlError.SqlError) => {
  const { sqlState } = pgFault(error)
  return sqlState === undefined ? "" : `, SQLSTATE ${sqlState}`
}

/** Whether a defect is a database error (rendered as `databaseUnavailable`, not a 500). */
export const isSqlError = (defect: unknown): defect is SqlError.SqlError => SqlError.isSqlError(defect)
