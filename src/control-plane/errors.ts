/** An error that becomes an HTTP answer with this status and `{ error: message }`. */
export class ApiError extends Error {
  override readonly name = "ApiError";
  constructor(
    readonly status: number,
    message: string,
    readonly issues?: { path: string; message: string }[],
    readonly headers?: Record<string, string>,
  ) {
    super(message);
  }
}
