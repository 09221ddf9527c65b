// Package deploy holds Gatekeeper's deployment and monitoring files and the
// tests that keep them honest. Its only code (monitoring.go) reads the
// PromQL expressions and metric names out of the monitoring files, for the
// tests here, in internal/worker and in integration/.
//
//   - docker/Dockerfile: the image (static binary, distroless, non-root), with a
//     second target for the sample producer.
//   - compose/compose.yaml: Kafka (KRaft), Redis, topic creation (retry tiers
//     included), Gatekeeper and a sample producer (compose/producer).
//   - k8s/: Deployment, ConfigMaps (environment and the live-reloaded limits
//     file), Secret, Service for metrics, PodDisruptionBudget and a KEDA
//     ScaledObject on the source topics' lag, tied together by kustomization.yaml.
//   - k8s/prometheusrule.yaml: the alert rules as a prometheus-operator
//     PrometheusRule, generated from prometheus/gatekeeper-rules.yaml.
//   - grafana/gatekeeper.json: the Grafana dashboard.
//   - prometheus/: the alert rules, their promtool unit tests and RUNBOOK.md.
//   - local/: scripts that run Kafka and Redis without Docker, for tests, and
//     promtool.sh, which installs promtool when missing.
//
// deploy_test.go decodes every manifest strictly into its real type (k8s.io/api
// types; KEDA's own keda.sh/v1alpha1 API package for the ScaledObject and
// TriggerAuthentication; prometheus-operator's monitoring/v1 package for the
// PrometheusRule; compose-go's loader with schema validation for
// compose.yaml; a local struct for kustomization.yaml), so that a misspelt field
// fails, and checks the files against each other and against the gatekeeper
// binary's own configuration check (gatekeeper check-config).
//
// prometheus_test.go runs promtool (through local/promtool.sh; a missing
// promtool that cannot be installed fails the tests) on the rule file and
// its unit tests, and on every dashboard query turned into a recording rule;
// checks each alert's annotations against RUNBOOK.md; and checks that
// k8s/prometheusrule.yaml holds exactly the rule file's groups.
package deploy
