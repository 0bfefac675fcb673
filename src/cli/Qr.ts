import qrcode from "qrcode-generator"

/** Light modules around the code; scanners need a margin of the background colour. */
const QUIET_ZONE = 2

/** The QR modules of `text` (byte mode, error correction M), quiet zone included: true is dark. */
export const qrMatrix = (text: string): ReadonlyArray<ReadonlyArray<boolean>> => {
  const qr = qrcode(0, "M")
  qr.addData(text, "Byte")
  qr.make()
  const size = qr.getModuleCount()
  const full = size + 2 * QUIET_ZONE
  return Array.from({ length: full }, (_, row) =>
    Array.from({ length: full }, (_, col) => {
      const r = row - QUIET_ZONE
      const c = col - QUIET_ZONE
      return r >= 0 && c >= 0 && r < size && c < size && qr.isDark(r, c)
    })
  )
}

const HALF_BLOCKS = [" ", "▄", "▀", "█"] as const

/**
 * The code for a terminal, two module rows per line with half blocks, dark modules drawn in ink. With `ansi`
 * each line is black on white, so the code reads the same on a dark terminal theme as on a light one.
 */
export const renderQr = (text: string, options: { readonly ansi: boolean }): string => {
  const matrix = qrMatrix(text)
  const lines: Array<string> = []
  for (let row = 0; row < matrix.length; row += 2) {
    const top = matrix[row]!
    const bottom = matrix[row + 1]
    const line = top.map((dark, col) => HALF_BLOCKS[(dark ? 2 : 0) + (bottom?.[col] ? 1 : 0)]).join("")
    lines.push(options.ansi ? `\u001b[30;47m${line}\u001b[0m` : line)
  }
  return lines.join("\n")
}
