// The security layer of serving without a model: the API key check, which addresses count as
// exposed, the HTTPS flag and file checks (errors name the file and never quote it), and mutual
// TLS on the gRPC instance API against a stand-in frontend — a client with a certificate from
// the instance's client CA is served; one without, one from another CA, and one that does not
// trust the instance's CA are refused; a certificate replaced on disk is picked up without a
// restart. Certificates are made here with the openssl command.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "serve/access.h"
#include "serve/grpc_service.h"
#include "serve/grpc_tls.h"
#include "serve/tls_context.h"
#include "switchyard/v1/engine.grpc.pb.h"

namespace sy {
namespace {

namespace fs = std::filesystem;
namespace pb = switchyard::v1;

// A certificate authority and the certificates it signs, in a temporary directory.
class Pki {
 public:
  Pki() {
    char pattern[] = "/tmp/sy-tls-test-XXXXXX";
    dir_ = ::mkdtemp(pattern);
  }
  ~Pki() { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // NAME.pem and NAME.key: a self-signed CA.
  void MakeCa(const std::string& name) {
    Run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 "
        "-subj /CN=" +
        name + " -keyout " + Path(name + ".key") + " -out " + Path(name + ".pem"));
  }

  // NAME.pem and NAME.key signed by CA, for the addresses in `san` (server and client use).
  void MakeLeaf(const std::string& name, const std::string& ca,
                const std::string& san = "IP:127.0.0.1,DNS:localhost") {
    std::ofstream(Path(name + ".ext"))
        << "subjectAltName=" << san
        << "\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n";
    Run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + name +
        " -keyout " + Path(name + ".key") + " -out " + Path(name + ".csr"));
    Run("openssl x509 -req -in " + Path(name + ".csr") + " -CA " + Path(ca + ".pem") + " -CAkey " +
        Path(ca + ".key") + " -set_serial " + std::to_string(++serial_) + " -days 30 -extfile " +
        Path(name + ".ext") + " -out " + Path(name + ".pem"));
  }

 private:
  static void Run(const std::string& command) {
    ASSERT_EQ(std::system((command + " >/dev/null 2>&1").c_str()), 0) << command;
  }
  std::string dir_;
  int serial_ = 1;
};

TEST(ApiKey, MatchesOnlyTheExactBearerHeader) {
  EXPECT_TRUE(serve::ApiKeyMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(serve::ApiKeyMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(serve::ApiKeyMatches("Bearer s3cretX", "s3cret"));
  EXPECT_FALSE(serve::ApiKeyMatches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(serve::ApiKeyMatches("s3cret", "s3cret"));
  EXPECT_FALSE(serve::ApiKeyMatches("", "s3cret"));
}

TEST(Exposure, LoopbackAddressesNeedNoWarning) {
  for (const char* host : {"127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"})
    EXPECT_TRUE(serve::IsLoopbackHost(host)) << host;
  for (const char* host : {"0.0.0.0", "::", "[::]", "10.0.0.5", "example.org", ""})
    EXPECT_FALSE(serve::IsLoopbackHost(host)) << host;
  EXPECT_EQ(serve::HttpExposureWarning("127.0.0.1", 8000, false, false), "");
  EXPECT_EQ(serve::GrpcExposureWarning("127.0.0.1", 9000, false, false), "");
}

TEST(Exposure, WarningsNameTheRiskAndTheRemedy) {
  const std::string open = serve::HttpExposureWarning("0.0.0.0", 8000, false, false);
  EXPECT_NE(open.find("0.0.0.0:8000"), std::string::npos) << open;
  EXPECT_NE(open.find("anyone"), std::string::npos) << open;
  EXPECT_NE(open.find("--api-key"), std::string::npos) << open;
  const std::string clear = serve::HttpExposureWarning("0.0.0.0", 8000, false, true);
  EXPECT_NE(clear.find("clear text"), std::string::npos) << clear;
  EXPECT_EQ(serve::HttpExposureWarning("0.0.0.0", 8000, true, false), "");
  const std::string grpc = serve::GrpcExposureWarning("0.0.0.0", 9000, false, false);
  EXPECT_NE(grpc.find("abort"), std::string::npos) << grpc;
  EXPECT_NE(grpc.find("--grpc-tls-client-ca"), std::string::npos) << grpc;
  // TLS without a client CA still lets any client in.
  EXPECT_NE(serve::GrpcExposureWarning("0.0.0.0", 9000, true, false), "");
  EXPECT_EQ(serve::GrpcExposureWarning("0.0.0.0", 9000, true, true), "");
}

TEST(TlsFlags, CombinationsThatCannotWorkAreNamed) {
  using serve::ClientCertificates;
  auto check = [](serve::TlsFiles files) { return serve::CheckTlsFlags(files).message(); };
  EXPECT_NE(check({"", "k.pem", "", ClientCertificates::kNone}).find("--ssl-certfile"),
            std::string::npos);
  EXPECT_NE(check({"c.pem", "", "", ClientCertificates::kNone}).find("--ssl-keyfile"),
            std::string::npos);
  EXPECT_NE(check({"", "", "ca.pem", ClientCertificates::kNone}).find("--ssl-ca-certs"),
            std::string::npos);
  EXPECT_NE(check({"c.pem", "k.pem", "", ClientCertificates::kRequired}).find("--ssl-ca-certs"),
            std::string::npos);
  EXPECT_TRUE(serve::CheckTlsFlags({"c.pem", "k.pem", "", ClientCertificates::kNone}).ok());
  EXPECT_FALSE(serve::CheckGrpcServerTls({"", "", "ca.pem"}).ok());
  EXPECT_FALSE(serve::CheckGrpcClientTls({"c.pem", "k.pem", ""}).ok());
}

TEST(TlsFiles, ErrorsNameTheFileAndNeverQuoteIt) {
  Pki pki;
  pki.MakeCa("ca");
  pki.MakeLeaf("server", "ca");
  pki.MakeLeaf("other", "ca");
  const std::string secret = pki.Path("secret.key");
  std::ofstream(secret) << "-----BEGIN PRIVATE KEY-----\nTOPSECRETMATERIAL\n-----END PRIVATE "
                           "KEY-----\n";
  using serve::ClientCertificates;
  auto bad_key =
      serve::MakeServerContext({pki.Path("server.pem"), secret, "", ClientCertificates::kNone});
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find(secret), std::string::npos);
  EXPECT_EQ(bad_key.status().message().find("TOPSECRET"), std::string::npos);
  auto missing = serve::MakeServerContext(
      {pki.Path("nope.pem"), pki.Path("server.key"), "", ClientCertificates::kNone});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.pem: No such file"), std::string::npos)
      << missing.status().message();
  auto mismatch = serve::MakeServerContext(
      {pki.Path("server.pem"), pki.Path("other.key"), "", ClientCertificates::kNone});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("does not match"), std::string::npos);
  EXPECT_TRUE(serve::MakeServerContext({pki.Path("server.pem"), pki.Path("server.key"),
                                        pki.Path("ca.pem"), ClientCertificates::kRequired})
                  .ok());
  EXPECT_FALSE(serve::CheckGrpcServerTls({pki.Path("server.pem"), secret, ""}).ok());
}

// Health is all the instance API needs for these tests; nothing is ever submitted.
class HealthyFrontend : public RequestFrontend {
 public:
  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest, SubmitError*) override {
    return Status::Error("not in this test");
  }
  void Abort(const std::string&) override {}
  EngineMetrics Metrics() const override {
    EngineMetrics m;
    m.healthy = true;
    return m;
  }
  void Stop(bool) override {}
};

class GrpcMutualTls : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_.MakeCa("ca");
    pki_.MakeCa("other_ca");
    pki_.MakeLeaf("instance", "ca");
    pki_.MakeLeaf("router", "ca");
    pki_.MakeLeaf("intruder", "other_ca");
    server_ = std::make_unique<serve::GrpcEngineServer>(frontend_, serve::InstanceInfo{});
    const serve::GrpcTlsFiles files{pki_.Path("instance.pem"), pki_.Path("instance.key"),
                                    pki_.Path("ca.pem")};
    ASSERT_TRUE(serve::CheckGrpcServerTls(files).ok());
    ASSERT_TRUE(server_->Start("127.0.0.1", 0, serve::GrpcServerCredentials(files)).ok());
  }

  // Health over a fresh channel with these client files (ca: whom the client trusts).
  grpc::Status Health(const serve::GrpcTlsFiles& files, const std::string& host = "127.0.0.1") {
    EXPECT_TRUE(serve::CheckGrpcClientTls(files).ok());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no connection shared between tests
    auto channel = grpc::CreateCustomChannel(fmt::format("{}:{}", host, server_->port()),
                                             serve::GrpcChannelCredentials(files), args);
    auto stub = pb::Engine::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::HealthResponse response;
    return stub->Health(&context, {}, &response);
  }

  Pki pki_;
  HealthyFrontend frontend_;
  std::unique_ptr<serve::GrpcEngineServer> server_;
};

TEST_F(GrpcMutualTls, ClientWithCertificateFromTheClientCaIsServed) {
  grpc::Status s = Health({pki_.Path("router.pem"), pki_.Path("router.key"), pki_.Path("ca.pem")});
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = Health({pki_.Path("router.pem"), pki_.Path("router.key"), pki_.Path("ca.pem")}, "localhost");
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(GrpcMutualTls, ClientWithoutCertificateIsRefused) {
  EXPECT_EQ(Health({"", "", pki_.Path("ca.pem")}).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcMutualTls, ClientCertificateFromAnotherCaIsRefused) {
  EXPECT_EQ(Health({pki_.Path("intruder.pem"), pki_.Path("intruder.key"), pki_.Path("ca.pem")})
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcMutualTls, InstanceNotSignedByTheTrustedCaIsRefused) {
  EXPECT_EQ(Health({pki_.Path("router.pem"), pki_.Path("router.key"), pki_.Path("other_ca.pem")})
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcMutualTls, PlaintextClientIsRefused) {
  auto channel = grpc::CreateChannel(fmt::format("127.0.0.1:{}", server_->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HealthResponse response;
  EXPECT_FALSE(pb::Engine::NewStub(channel)->Health(&context, {}, &response).ok());
}

TEST_F(GrpcMutualTls, CertificateReplacedOnDiskIsServedWithoutRestart) {
  // The instance's certificate and key are replaced by one from another CA: within the
  // provider's refresh interval, clients trusting only that CA get through.
  pki_.MakeLeaf("renewed", "other_ca");
  const serve::GrpcTlsFiles trusting_other{pki_.Path("router.pem"), pki_.Path("router.key"),
                                           pki_.Path("other_ca.pem")};
  EXPECT_FALSE(Health(trusting_other).ok());
  // Key first would leave a moment where the pair mismatches; the provider skips such reads.
  fs::copy_file(pki_.Path("renewed.key"), pki_.Path("instance.key"),
                fs::copy_options::overwrite_existing);
  fs::copy_file(pki_.Path("renewed.pem"), pki_.Path("instance.pem"),
                fs::copy_options::overwrite_existing);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(3 * serve::kGrpcTlsRefreshSeconds);
  grpc::Status s;
  while (!(s = Health(trusting_other)).ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace sy
