package deploy

import (
	keda "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
)

// The KEDA types the manifests decode into, strictly: KEDA's own
// keda.sh/v1alpha1 API package.
type (
	scaledObject          = keda.ScaledObject
	triggerAuthentication = keda.TriggerAuthentication
)

// kafkaTriggerMetadata are the metadata keys of KEDA's kafka scaler
// (pkg/scalers/kafka_scaler.go). KEDA ignores keys it does not know, so a
// misspelt key (consumergroup) would silently fall back to a default; the
// test rejects any key not listed here.
var kafkaTriggerMetadata = map[string]bool{
	"bootstrapServers": true, "bootstrapServersFromEnv": true,
	"consumerGroup": true, "consumerGroupFromEnv": true,
	"topic": true, "topicFromEnv": true,
	"lagThreshold": true, "activationLagThreshold": true,
	"offsetResetPolicy": true, "allowIdleConsumers": true,
	"scaleToZeroOnInvalidOffset": true, "excludePersistentLag": true,
	"limitToPartitionsWithLag": true, "ensureEvenDistributionOfPartitions": true,
	"partitionLimitation": true, "version": true,
	"sasl": true, "tls": true, "unsafeSsl": true,
}

// kustomization is the part of kustomize's Kustomization
// (kustomize.config.k8s.io/v1beta1) that deploy/k8s uses.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}
