// Package deploy holds Gatekeeper's deployment files and the test that keeps
// them honest. It has no code of its own.
//
//   - docker/Dockerfile: the image (static binary, distroless, non-root), with a
//     second target for the sample producer.
//   - compose/compose.yaml: Kafka (KRaft), Redis, topic creation (retry tiers
//     included), Gatekeeper and a sample producer (compose/producer).
//   - k8s/: Deployment, ConfigMaps (environment and the live-reloaded limits
//     file), Secret, Service for metrics, PodDisruptionBudget and a KEDA
//     ScaledObject on the source topics' lag, tied together by kustomization.yaml.
//   - local/: scripts that run Kafka and Redis without Docker, for tests.
//
// deploy_test.go decodes every manifest strictly into its real type (k8s.io/api
// types; KEDA's own keda.sh/v1alpha1 API package for the ScaledObject and
// TriggerAuthentication; compose-go's loader with schema validation for
// compose.yaml; a local struct for kustomization.yaml), so that a misspelt field
// fails, and checks the files against each other and against the gatekeeper
// binary's own configuration check (gatekeeper check-config).
package deploy
