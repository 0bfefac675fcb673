import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import type { TestProject } from "vitest/node"
import { startEmbeddedPostgres } from "../../src/devnet/EmbeddedPostgres.ts"

declare module "vitest" {
  export interface ProvidedContext {
    /** A Postgres URL whose user may CREATE DATABASE; each test file makes its own database. */
    adminDatabaseUrl: string
  }
}

/**
 * The suite starts what it needs: `DATABASE_URL` when set, otherwise one embedded Postgres
 * for the whole run in a throwaway folder. Each test file creates its own database
 * (test/support/Database.ts); each chain test starts its own Anvil.
 */
export default async function setup(project: TestProject) {
  const configured = process.env.DATABASE_URL
  if (configured !== undefined && configured !== "") {
    project.provide("adminDatabaseUrl", configured)
    return
  }
  const dataDir = mkdtempSync(join(tmpdir(), "svc-test-pg-"))
  const scope = await Effect.runPromise(Scope.make())
  const url = await Effect.runPromise(
    // fsync off: a throwaway database for this run only (the router itself keeps fsync on).
    startEmbeddedPostgres({ dataDir, database: "svc_admin", durable: false }).pipe(Scope.provide(scope))
  )
  project.provide("adminDatabaseUrl", url)
  return async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    rmSync(dataDir, { recursive: true, force: true })
  }
}
