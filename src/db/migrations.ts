import { capacitySlots } from "./migrations/capacitySlots.ts"
import type { Migrations } from "./migrations/Migrations.ts"
import { marketData } from "./migrations/marketData.ts"
import { paidPath } from "./migrations/paidPath.ts"
import { payoutScan } from "./migrations/payoutScan.ts"
import { perRequest } from "./migrations/perRequest.ts"
import { programs } from "./migrations/programs.ts"
import { queueReads } from "./migrations/queueReads.ts"
import { releasePlans } from "./migrations/releasePlans.ts"
import { reliability } from "./migrations/reliability.ts"
import { settlementEvidence } from "./migrations/settlementEvidence.ts"
import { statementClears } from "./migrations/statementClears.ts"
import { statementPoints } from "./migrations/statementPoints.ts"
import { walletHours } from "./migrations/walletHours.ts"

/**
 * Numbered, append-only migrations. Each runs once (the migrator records it in
 * `effect_sql_migrations`); a new schema change is a new entry, never an edit.
 */
/** Every migration, by id (the migrator runs them in id order); each module holds one part of the schema. */
export const migrations: Migrations = {
  ...paidPath,
  ...programs,
  ...marketData,
  ...reliability,
  ...perRequest,
  ...payoutScan,
  ...settlementEvidence,
  ...capacitySlots,
  ...statementPoints,
  ...statementClears,
  ...queueReads,
  ...walletHours,
  ...releasePlans
}
