/** The cache record as the node agent moves it (shared with the release controller and the operator commands). */
export * from "../common/cache-record.js";
