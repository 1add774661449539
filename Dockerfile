# syntax=docker/dockerfile:1
# The one Warmstart image: every role (webhook, server, node-agent, cluster-agent, control-plane)
# and every init step (wait-ready, seed, prewarm) is `warmstart <subcommand>`. The same layout as
# the local cluster's image build (tools/localcluster/images/build.ts): a Debian minbase with
# python3, Node.js at /usr/local/bin/node, the production node_modules, then the app in
# /opt/warmstart; non-root, and nothing written outside mounted volumes (read-only root works).
#
#   docker build -t ghcr.io/warmstart/warmstart:0.1.0 .

# Keep in step with IMAGE_NODE_VERSION in tools/localcluster/images/build.ts (a test compares them).
ARG NODE_VERSION=20.20.2
ARG DEBIAN_SUITE=bookworm

FROM node:${NODE_VERSION}-${DEBIAN_SUITE} AS build
WORKDIR /opt/warmstart
COPY package.json package-lock.json ./
# Dependencies without the package's own `prepare` (the sources come next), then the native
# modules' install steps (better-sqlite3 builds or fetches its binding for this platform).
RUN npm ci --no-audit --no-fund --ignore-scripts && npm rebuild
# The product only: src/ without its tests (tsconfig.product.json). The tools (tools/: the local
# cluster, the demo), the tests and the benchmarks never enter the image.
COPY tsconfig.json tsconfig.product.json ./
COPY src ./src
COPY bin ./bin
COPY deploy/crds ./deploy/crds
RUN npx tsc -p tsconfig.product.json \
 && find dist -name '*.map' -delete \
 && npm prune --omit=dev --no-audit --no-fund \
 && rm -rf node_modules/better-sqlite3/deps node_modules/better-sqlite3/src \
      node_modules/better-sqlite3/build/Release/obj node_modules/better-sqlite3/build/Release/obj.target

FROM debian:${DEBIAN_SUITE}-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt /usr/share/doc /usr/share/man /usr/share/locale /usr/share/info
COPY --from=build /usr/local/bin/node /usr/local/bin/node
COPY --from=build /opt/warmstart/node_modules /opt/warmstart/node_modules
COPY --from=build /opt/warmstart/package.json /opt/warmstart/package.json
COPY --from=build /opt/warmstart/bin /opt/warmstart/bin
COPY --from=build /opt/warmstart/deploy/crds /opt/warmstart/deploy/crds
COPY --from=build /opt/warmstart/dist/src /opt/warmstart/dist/src
# The CSI driver's vendored protocol files, loaded at start (src/node-agent/csi/proto/README.md).
COPY --from=build /opt/warmstart/src/node-agent/csi/proto /opt/warmstart/src/node-agent/csi/proto
RUN printf '#!/bin/sh\nexec /usr/local/bin/node /opt/warmstart/bin/warmstart "$@"\n' > /usr/local/bin/warmstart \
 && chmod 0755 /usr/local/bin/warmstart
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin NODE_ENV=production
WORKDIR /opt/warmstart
# The node agent asks for root in its pod spec (it keeps captured files' owners); nothing else does.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/warmstart"]
