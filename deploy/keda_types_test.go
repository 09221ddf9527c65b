package deploy

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Local copies of KEDA's keda.sh/v1alpha1 types (github.com/kedacore/keda/v2,
// apis/keda/v1alpha1, as of v2.21), field for field and with the same JSON
// names, so that the manifests decode strictly. KEDA's package itself is not
// imported: it also holds the admission webhooks, which pull in
// controller-runtime, expr and KEDA's metrics code. Status is left out (a
// manifest has none), and so are the TriggerAuthentication sources this
// repository does not use (hashiCorpVault, azureKeyVault, gcpSecretManager,
// awsSecretManager): a manifest that starts using one fails here until its
// type is added.

// scaledObject is keda.sh/v1alpha1 ScaledObject.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec scaledObjectSpec `json:"spec"`
}

type scaledObjectSpec struct {
	ScaleTargetRef        *scaleTarget    `json:"scaleTargetRef"`
	PollingInterval       *int32          `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32          `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32          `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32          `json:"maxReplicaCount,omitempty"`
	Advanced              *advancedConfig `json:"advanced,omitempty"`
	Triggers              []scaleTriggers `json:"triggers"`
	Fallback              *fallback       `json:"fallback,omitempty"`
}

type fallback struct {
	FailureThreshold int32  `json:"failureThreshold"`
	Replicas         int32  `json:"replicas"`
	Behavior         string `json:"behavior,omitempty"`
}

type advancedConfig struct {
	HorizontalPodAutoscalerConfig *horizontalPodAutoscalerConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	RestoreToOriginalReplicaCount bool                           `json:"restoreToOriginalReplicaCount,omitempty"`
	ScalingModifiers              scalingModifiers               `json:"scalingModifiers,omitempty"`
}

type scalingModifiers struct {
	Formula          string                         `json:"formula,omitempty"`
	Target           string                         `json:"target,omitempty"`
	ActivationTarget string                         `json:"activationTarget,omitempty"`
	MetricType       autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type horizontalPodAutoscalerConfig struct {
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
	Name     string                                         `json:"name,omitempty"`
}

type scaleTarget struct {
	Name                   string `json:"name"`
	APIVersion             string `json:"apiVersion,omitempty"`
	Kind                   string `json:"kind,omitempty"`
	EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
}

type scaleTriggers struct {
	Type              string                         `json:"type"`
	Name              string                         `json:"name,omitempty"`
	UseCachedMetrics  bool                           `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string              `json:"metadata"`
	AuthenticationRef *authenticationRef             `json:"authenticationRef,omitempty"`
	MetricType        autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type authenticationRef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

// triggerAuthentication is keda.sh/v1alpha1 TriggerAuthentication.
type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec triggerAuthenticationSpec `json:"spec"`
}

type triggerAuthenticationSpec struct {
	PodIdentity        *authPodIdentity  `json:"podIdentity,omitempty"`
	SecretTargetRef    []authTargetRef   `json:"secretTargetRef,omitempty"`
	ConfigMapTargetRef []authTargetRef   `json:"configMapTargetRef,omitempty"`
	Env                []authEnvironment `json:"env,omitempty"`
}

type authPodIdentity struct {
	Provider              string  `json:"provider"`
	IdentityID            *string `json:"identityId"`
	IdentityTenantID      *string `json:"identityTenantId"`
	IdentityAuthorityHost *string `json:"identityAuthorityHost"`
	RoleArn               *string `json:"roleArn"`
	IdentityOwner         *string `json:"identityOwner"`
}

type authTargetRef struct {
	Parameter string `json:"parameter"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

type authEnvironment struct {
	Parameter     string `json:"parameter"`
	Name          string `json:"name"`
	ContainerName string `json:"containerName,omitempty"`
}

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
