import { Schema } from "effect"

/** Building blocks the wire schemas share. */

/** An optional field that may also be sent as `null`. */
export const optionalNullable = <S extends Schema.Top>(schema: S) => Schema.optionalKey(Schema.NullOr(schema))

/** The last member of a union of blocks, items or tools: anything else, kept by its `type` to be refused by name. */
export const Loose = Schema.Struct({ type: Schema.String })

export const Int = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  Schema.Int.check(Schema.isGreaterThanOrEqualTo(min), Schema.isLessThanOrEqualTo(max))
