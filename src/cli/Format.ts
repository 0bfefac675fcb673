const UNIT_SECONDS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 }

/** `90m`, `12h`, `30d`, `2w` or plain seconds, to seconds; undefined when it is none of these. */
export const parseDuration = (text: string): number | undefined => {
  const match = /^(\d{1,7})\s*([smhdw]?)$/.exec(text.trim().toLowerCase())
  if (match === null) return undefined
  return Number(match[1]) * UNIT_SECONDS[match[2] === "" ? "s" : match[2]!]!
}

/** Enough of a key to recognise it in the wallet's key list, never enough to use it. */
export const maskKey = (secret: string) => `${secret.slice(0, 11)}…${secret.slice(-4)}`

/** Milliseconds as `m:ss`. */
export const formatRemaining = (ms: number) => {
  const seconds = Math.max(0, Math.ceil(ms / 1000))
  return `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`
}
