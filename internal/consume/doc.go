// Package consume is Gatekeeper's consumer-group plumbing.
//
// It reads topics as one member of a Kafka consumer group (kafka-go's
// ConsumerGroup), runs one goroutine per assigned partition and hands each
// partition's messages to a [Handler] in batches, in offset order. It knows
// nothing about tenants, limits or routing: those live in the Handler.
//
// Two consumers are provided:
//
//   - [Group] reads source topics. A batch is bounded by Config.BatchSize and
//     Config.BatchWait; the offset after its last message is committed only
//     once the Handler has returned nil for the whole batch. With
//     Config.DecideAhead and a [Stager], a partition stages its next batch
//     (a Gate's limiter call) while the batch before it is finished (its
//     writes), and finishes and commits batches in order.
//   - [Delayed] reads the retry tier topics. It keeps a bounded look-ahead of
//     messages per partition ordered by release time, hands a message to the
//     Handler never before its release time, and commits only the contiguous
//     prefix of handled offsets.
//
// # Delivery
//
// Delivery is at least once. An offset is committed only after the Handler has
// acknowledged that message and every earlier message of its partition, with
// the generation that assigned the partition; the group coordinator refuses
// a commit once the group has moved on without this member. No message is
// skipped.
//
// A handover hands nothing twice. At a rebalance or a shutdown, the in-flight
// batches finish and are committed before the member rejoins or leaves, so
// the next owner starts where the last one stopped. Delayed, whose messages
// finish out of offset order, also writes the offsets done beyond the
// committed one into the commit's metadata; the next owner reads it and skips
// them (see handover.go for the format and what happens when it does not fit,
// and trust.go for when a done set is not taken: unsigned or badly signed
// with DelayedConfig.MetadataKeys, or reaching beyond the partition's end).
//
// Every Handle call's context carries the generation's WriteFence
// ([FenceOf]): a member writes only while the group coordinator cannot yet
// have given its partitions to another member, as its own heartbeats tell
// (fence.go). A writer that honours it (route.FencedWriter) sends nothing
// once it has ended, so a member cut off from Kafka lands none of its queued
// writes after the partitions' next owner may have handled them.
//
// With Config.Leases, a member that crashed is removed from the group once
// its lease ends, so that its partitions move within a lease rather than a
// session timeout (lease.go).
//
// A crash, or a commit that fails, can make a message be handled again: at
// most what was acknowledged since the partition's last successful commit
// (for Group the batch being handled and the one whose commit was in flight;
// for Delayed the batch being handled, since it commits after each). A
// failing batch is retried, with capped exponential backoff, until it
// succeeds or the partition is stopped. So that a Handler can recognise
// what it is given again, each [Batch] carries the partition's committed
// offset as the consumer knows it (Batch.Committed): nothing below it is ever
// handed over again.
//
// # Missing topics
//
// A subscribed topic that does not exist, for instance one deleted under a
// running group, is a configuration error: the member leaves the group
// (consuming none of its topics), reports not ready, logs an error naming
// the topic, and rejoins once the topic exists again. Staying in the group
// would make kafka-go end every generation at once and rejoin in a tight
// loop.
//
// # Shutdown
//
// Run returns nil once its context is cancelled, after it has stopped
// fetching, let every in-flight Handle call finish (with a context that
// shutdown does not cancel, bounded by Config.DrainTimeout), committed what
// was acknowledged and closed the group, which leaves it so that the other
// members take over the partitions at once.
package consume
