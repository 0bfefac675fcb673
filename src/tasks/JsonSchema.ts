/**
 * The JSON Schema subset an acceptance contract may use for a task's output (docs/decisions.md D143):
 * `type` (one or a list), `properties`, `required`, `additionalProperties` (boolean), `items`, `enum`,
 * `const`, `minLength`/`maxLength`, `minimum`/`maximum`, `minItems`/`maxItems`. A contract naming any
 * other keyword is refused when it is frozen, so no criterion is silently ignored. Pure.
 */

const KEYWORDS = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "enum",
  "const",
  "minLength",
  "maxLength",
  "minimum",
  "maximum",
  "minItems",
  "maxItems",
  "title",
  "description",
  "$schema"
])
const TYPES = new Set(["string", "number", "integer", "boolean", "object", "array", "null"])

type Json = null | boolean | number | string | ReadonlyArray<Json> | { readonly [key: string]: Json }

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** Why `schema` is outside the subset (empty: it is inside). */
export const unsupported = (schema: unknown, at = "$"): ReadonlyArray<string> => {
  if (typeof schema === "boolean") return []
  if (!isObject(schema)) return [`${at}: a schema is an object or a boolean`]
  const problems: Array<string> = []
  for (const key of Object.keys(schema))
    if (!KEYWORDS.has(key)) problems.push(`${at}: "${key}" is not supported`)
  const type = schema.type
  if (type !== undefined) {
    const types = Array.isArray(type) ? type : [type]
    for (const t of types)
      if (typeof t !== "string" || !TYPES.has(t)) problems.push(`${at}: unknown type ${String(t)}`)
  }
  if (schema.properties !== undefined) {
    if (!isObject(schema.properties)) problems.push(`${at}.properties: must be an object`)
    else
      for (const [k, v] of Object.entries(schema.properties)) problems.push(...unsupported(v, `${at}.${k}`))
  }
  if (schema.items !== undefined) problems.push(...unsupported(schema.items, `${at}[]`))
  if (schema.additionalProperties !== undefined && typeof schema.additionalProperties !== "boolean") {
    problems.push(`${at}.additionalProperties: only true or false is supported`)
  }
  if (
    schema.required !== undefined &&
    !(Array.isArray(schema.required) && schema.required.every((r) => typeof r === "string"))
  ) {
    problems.push(`${at}.required: must be a list of names`)
  }
  if (schema.enum !== undefined && !Array.isArray(schema.enum)) problems.push(`${at}.enum: must be a list`)
  return problems
}

const typeOf = (value: unknown): string =>
  value === null
    ? "null"
    : Array.isArray(value)
      ? "array"
      : typeof value === "number"
        ? Number.isInteger(value)
          ? "integer"
          : "number"
        : typeof value

const matchesType = (value: unknown, type: string) => {
  const actual = typeOf(value)
  return actual === type || (type === "number" && actual === "integer")
}

/** JSON equality (key order ignored). */
const equal = (a: unknown, b: unknown): boolean => {
  if (a === b) return true
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => equal(x, b[i]))
  if (isObject(a) && isObject(b)) {
    const keys = Object.keys(a)
    return (
      keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]))
    )
  }
  return false
}

/** Where `value` breaks `schema` (empty: it matches). `schema` must be inside the subset. */
export const violations = (schema: unknown, value: unknown, at = "$"): ReadonlyArray<string> => {
  if (schema === true) return []
  if (schema === false) return [`${at}: no value is allowed`]
  if (!isObject(schema)) return [`${at}: invalid schema`]
  const problems: Array<string> = []
  if (schema.type !== undefined) {
    const types = (Array.isArray(schema.type) ? schema.type : [schema.type]) as ReadonlyArray<string>
    if (!types.some((t) => matchesType(value, t)))
      return [`${at}: expected ${types.join(" or ")}, got ${typeOf(value)}`]
  }
  if (schema.const !== undefined && !equal(schema.const, value))
    problems.push(`${at}: must equal the constant`)
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => equal(e, value)))
    problems.push(`${at}: not one of the allowed values`)
  if (typeof value === "string") {
    if (typeof schema.minLength === "number" && [...value].length < schema.minLength)
      problems.push(`${at}: shorter than ${schema.minLength}`)
    if (typeof schema.maxLength === "number" && [...value].length > schema.maxLength)
      problems.push(`${at}: longer than ${schema.maxLength}`)
  }
  if (typeof value === "number") {
    if (typeof schema.minimum === "number" && value < schema.minimum)
      problems.push(`${at}: below ${schema.minimum}`)
    if (typeof schema.maximum === "number" && value > schema.maximum)
      problems.push(`${at}: above ${schema.maximum}`)
  }
  if (Array.isArray(value)) {
    if (typeof schema.minItems === "number" && value.length < schema.minItems)
      problems.push(`${at}: fewer than ${schema.minItems} items`)
    if (typeof schema.maxItems === "number" && value.length > schema.maxItems)
      problems.push(`${at}: more than ${schema.maxItems} items`)
    if (schema.items !== undefined) {
      value.forEach((item, i) => {
        problems.push(...violations(schema.items, item, `${at}[${i}]`))
      })
    }
  }
  if (isObject(value)) {
    const properties = isObject(schema.properties) ? schema.properties : {}
    if (Array.isArray(schema.required)) {
      for (const name of schema.required as ReadonlyArray<string>)
        if (!Object.hasOwn(value, name)) problems.push(`${at}: missing "${name}"`)
    }
    for (const [key, item] of Object.entries(value)) {
      if (Object.hasOwn(properties, key)) problems.push(...violations(properties[key], item, `${at}.${key}`))
      else if (schema.additionalProperties === false) problems.push(`${at}: "${key}" is not allowed`)
    }
  }
  return problems
}

export type { Json }
