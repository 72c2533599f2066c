// The router's view of an instance's queue (route/queue_estimate.h), one ordering of routing,
// probes and stream ends at a time: each case is one the probe-epoch bookkeeping it replaced got
// wrong or could get wrong.
#include "route/queue_estimate.h"

#include <gtest/gtest.h>

namespace sy::route {
namespace {

using Listed = std::vector<std::pair<std::string, int64_t>>;

TEST(QueueEstimate, ARequestCountsItsEstimateUntilTheInstanceListsIt) {
  QueueEstimate q;
  q.Routed("a", 100);
  EXPECT_EQ(q.Queued(), 100);
  // A probe answered before the request reached the engine's queue: it is not listed.
  q.Answered(q.Asked(), 0, {});
  EXPECT_EQ(q.Queued(), 100);
  // Listed, with the instance's own figure (part of its prompt was cached).
  q.Answered(q.Asked(), 60, {{"a", 60}});
  EXPECT_EQ(q.Queued(), 60);
}

TEST(QueueEstimate, ARequestRoutedWhileAProbeIsOutIsCountedOnceWhicheverArrivedFirst) {
  for (bool listed : {false, true}) {
    QueueEstimate q;
    const uint64_t probe = q.Asked();
    q.Routed("a", 100);
    q.Answered(probe, listed ? 90 : 0, listed ? Listed{{"a", 90}} : Listed{});
    EXPECT_EQ(q.Queued(), listed ? 90 : 100) << listed;
    q.Ended("a");
    EXPECT_EQ(q.Queued(), 0) << listed;  // the old bookkeeping left 90 here until the next probe
  }
}

TEST(QueueEstimate, AnEndedRequestStillInTheInstancesLastSnapshotWeighsNothing) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 100, {{"a", 100}});
  q.Ended("a");
  EXPECT_EQ(q.Queued(), 0);
  // The engine publishes its queue after the step that sent the last token: a probe asked
  // after the end can still list the request, and must not count it as someone else's.
  q.Answered(q.Asked(), 8, {{"a", 8}});
  EXPECT_EQ(q.Queued(), 0);
  EXPECT_EQ(q.tracked(), 1u);
  q.Answered(q.Asked(), 0, {});
  EXPECT_EQ(q.Queued(), 0);
  EXPECT_EQ(q.tracked(), 0u);  // let go once an answer no longer lists it
}

TEST(QueueEstimate, AnEndedRequestIsKeptUntilAProbeAskedAfterTheEndAnswers) {
  QueueEstimate q;
  q.Routed("a", 100);
  const uint64_t early = q.Asked();  // answered late, from a snapshot taken before "a" arrived
  q.Ended("a");
  q.Answered(early, 0, {});
  EXPECT_EQ(q.tracked(), 1u);
  q.Answered(q.Asked(), 5, {{"a", 5}});  // a later snapshot, still before the engine's publish
  EXPECT_EQ(q.Queued(), 0);
}

TEST(QueueEstimate, ARequestListedOnceAndNoLongerIsFinishedBeforeItsStreamEnds) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 40, {{"a", 40}});
  q.Answered(q.Asked(), 0, {});
  EXPECT_EQ(q.Queued(), 0);
}

TEST(QueueEstimate, OtherClientsWorkCountsAsTheInstanceSaid) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 250, {{"a", 50}, {"theirs", 200}});
  EXPECT_EQ(q.Queued(), 250);
  q.Ended("a");
  EXPECT_EQ(q.Queued(), 200);
  q.Routed("b", 30);
  EXPECT_EQ(q.Queued(), 230);
}

TEST(QueueEstimate, SequencesOfOneRequestAddUp) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 70, {{"a", 30}, {"a", 40}});  // beams of one request
  EXPECT_EQ(q.Queued(), 70);
}

TEST(QueueEstimate, EndingTwiceOrUnknownIdsChangesNothing) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Routed("b", 10);
  q.Ended("a");
  q.Ended("a");
  q.Ended("never routed");
  EXPECT_EQ(q.Queued(), 10);
}

TEST(QueueEstimate, RoutedAgainStartsOver) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 40, {{"a", 40}});
  q.Ended("a");  // failed there, and comes back to the same instance with its output so far
  q.Routed("a", 70);
  EXPECT_EQ(q.Queued(), 70);
}

TEST(QueueEstimate, ClearForgetsTheInstance) {
  QueueEstimate q;
  q.Routed("a", 100);
  q.Answered(q.Asked(), 500, {{"a", 100}});
  q.Clear();
  EXPECT_EQ(q.Queued(), 0);
  EXPECT_EQ(q.tracked(), 0u);
}

}  // namespace
}  // namespace sy::route
