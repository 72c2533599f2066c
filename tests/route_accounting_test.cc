// The router's view of an instance: its queue (route/queue_estimate.h), one ordering of routing,
// probes and stream ends at a time, each case one the probe-epoch bookkeeping it replaced got
// wrong or could get wrong; and the pages sent there that its cache mirror does not show yet
// (route/pending_pages.h).
#include "route/pending_pages.h"
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

TEST(PendingPages, HeldWhileInFlightHoweverLongThenForTheGrace) {
  PendingPages pages;
  pages.Hold({1, 2}, 0);
  // A long prompt's prefill: an hour on, still held (a fixed 5 s from routing forgot it).
  EXPECT_TRUE(pages.Holds(1, 3600));
  EXPECT_FALSE(pages.Holds(3, 0));
  pages.Release({1, 2}, 3600);
  EXPECT_TRUE(pages.Holds(2, 3600 + PendingPages::kGraceSeconds));
  EXPECT_FALSE(pages.Holds(2, 3600 + PendingPages::kGraceSeconds + 1));
}

TEST(PendingPages, ASharedPageIsHeldUntilItsLastRequestEnds) {
  PendingPages pages;
  pages.Hold({7, 8}, 0);
  pages.Hold({7}, 1);
  pages.Release({7, 8}, 2);
  EXPECT_TRUE(pages.Holds(7, 100));  // the second request is still in flight
  EXPECT_FALSE(pages.Holds(8, 100));
  pages.Release({7}, 100);
  EXPECT_TRUE(pages.Holds(7, 100 + PendingPages::kGraceSeconds));
  // Released more often than held (a second release after a failover): no effect.
  pages.Release({7, 7, 9}, 200);
  EXPECT_FALSE(pages.Holds(7, 200));
}

TEST(PendingPages, ClearedPagesStayForgottenWhenTheirRequestsEnd) {
  PendingPages pages;
  pages.Hold({5}, 0);
  pages.Clear();  // the instance failed
  pages.Release({5}, 1);
  EXPECT_FALSE(pages.Holds(5, 1));
  EXPECT_EQ(pages.size(), 0u);
}

}  // namespace
}  // namespace sy::route
