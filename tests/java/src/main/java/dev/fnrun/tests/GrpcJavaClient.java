package dev.fnrun.tests;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.ByteString;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.MethodDescriptorProto;
import com.google.protobuf.DescriptorProtos.ServiceDescriptorProto;
import com.google.protobuf.Descriptors;
import com.google.protobuf.Message;
import com.google.protobuf.util.JsonFormat;
import io.grpc.CallOptions;
import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.MethodDescriptor;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.reflection.v1.ServerReflectionGrpc;
import io.grpc.reflection.v1.ServerReflectionRequest;
import io.grpc.protobuf.ProtoUtils;
import io.grpc.reflection.v1.ServerReflectionResponse;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * fnrun's gRPC APIs called with grpc-java (grpc-netty-shaded), each outcome
 * printed on stdout as one JSON object:
 *
 * <pre>
 * run-function --target T --image IMAGE      FunctionIO on stdin; {code, message, output}
 * evaluate --target T --image IMAGE          ResourceList on stdin; {code, message, resource_list, log}
 * reflection --target T --symbol SYMBOL      server reflection v1; {services, file: {name, package, services}}
 * crossplane-call --target HOST:PORT --authority A [--ca F --cert F --key F --server-name N]
 *                                            a v1 RunFunctionRequest as protojson on stdin;
 *                                            {code, message, response (protojson or null)}
 * </pre>
 *
 * <p>Targets: {@code unix:PATH} and {@code HOST:PORT} are grpc-java's own
 * (its unix name resolver and Netty's epoll domain sockets; its default
 * {@code :authority}). grpc-java has no {@code unix-abstract:} scheme: for
 * {@code unix-abstract:NAME} the channel is Netty's, on the address
 * {@code \0NAME}, as grpc-java's documentation says to dial other socket
 * addresses. {@code code} is the status code's name ({@code OK},
 * {@code INVALID_ARGUMENT}, ...).
 *
 * <p>The calls are grpc-java's {@link ClientCalls} on {@link MethodDescriptor}s
 * built from the services the protos declare, with protobuf marshallers:
 * what the stubs of grpc-java's protoc plugin hold (its executables could not
 * be had here).
 *
 * <p>Over mTLS grpc-java takes the TLS server name (SNI, and the name the
 * server's certificate is verified for) from the {@code :authority}, as
 * Crossplane's grpc-go does: {@code --server-name} must be its host.
 */
public final class GrpcJavaClient {
  private static final int MAX_MESSAGE = 128 << 20;
  private static final long TIMEOUT_SECONDS = 120;

  private GrpcJavaClient() {}

  public static void main(String[] argv) throws Exception {
    if (argv.length == 0) {
      usage("no command");
    }
    Map<String, String> flags = flags(argv);
    JsonObject result;
    switch (argv[0]) {
      case "run-function":
        result = runFunction(flags);
        break;
      case "evaluate":
        result = evaluate(flags);
        break;
      case "reflection":
        result = reflection(flags);
        break;
      case "crossplane-call":
        result = crossplaneCall(flags);
        break;
      default:
        usage("unknown command " + argv[0]);
        return;
    }
    System.out.println(new Gson().toJson(result));
    System.out.flush();
    System.exit(0);
  }

  private static void usage(String why) {
    System.err.println(
        "grpc-java-client: "
            + why
            + "\nusage: run-function|evaluate --target T --image IMAGE < input\n"
            + "       reflection --target T --symbol SYMBOL\n"
            + "       crossplane-call --target HOST:PORT --authority A"
            + " [--ca F --cert F --key F --server-name N] < request.json");
    System.exit(2);
  }

  private static Map<String, String> flags(String[] argv) {
    Map<String, String> flags = new HashMap<>();
    for (int i = 1; i < argv.length; i += 2) {
      if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
        usage("bad flag " + argv[i]);
      }
      flags.put(argv[i].substring(2), argv[i + 1]);
    }
    return flags;
  }

  private static String need(Map<String, String> flags, String name) {
    String value = flags.get(name);
    if (value == null) {
      usage("--" + name + " is required");
    }
    return value;
  }

  private static byte[] stdin() throws IOException {
    return System.in.readAllBytes();
  }

  /** A channel and what must be shut down with it. */
  private static final class Conn implements AutoCloseable {
    final ManagedChannel channel;
    final EventLoopGroup group;

    Conn(ManagedChannel channel, EventLoopGroup group) {
      this.channel = channel;
      this.group = group;
    }

    @Override
    public void close() throws InterruptedException {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
      if (group != null) {
        group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
      }
    }
  }

  private static Conn connect(String target, ChannelCredentials credentials, String authority) {
    ManagedChannelBuilder<?> builder;
    EventLoopGroup group = null;
    if (target.startsWith("unix-abstract:")) {
      String name = target.substring("unix-abstract:".length());
      group = new EpollEventLoopGroup(1);
      builder =
          NettyChannelBuilder.forAddress(new DomainSocketAddress("\0" + name), credentials)
              .eventLoopGroup(group)
              .channelType(EpollDomainSocketChannel.class);
    } else {
      builder = Grpc.newChannelBuilder(target, credentials);
    }
    if (authority != null) {
      builder.overrideAuthority(authority);
    }
    return new Conn(builder.maxInboundMessageSize(MAX_MESSAGE).build(), group);
  }

  private static JsonObject failed(StatusRuntimeException e) {
    JsonObject result = new JsonObject();
    result.addProperty("code", e.getStatus().getCode().name());
    String description = e.getStatus().getDescription();
    result.addProperty("message", description == null ? "" : description);
    return result;
  }

  /**
   * The unary method {@code service}/{@code method} of {@code file}, with
   * protobuf marshallers for {@code request}'s and {@code response}'s types,
   * which must be the method's.
   */
  private static <Q extends Message, R extends Message> MethodDescriptor<Q, R> unary(
      Descriptors.FileDescriptor file, String service, String method, Q request, R response) {
    Descriptors.ServiceDescriptor s = file.findServiceByName(service);
    Descriptors.MethodDescriptor m = s == null ? null : s.findMethodByName(method);
    if (m == null
        || m.isClientStreaming()
        || m.isServerStreaming()
        || m.getInputType() != request.getDescriptorForType()
        || m.getOutputType() != response.getDescriptorForType()) {
      throw new IllegalStateException(
          "no unary " + service + "/" + method + " of these types in " + file.getName());
    }
    return MethodDescriptor.<Q, R>newBuilder()
        .setType(MethodDescriptor.MethodType.UNARY)
        .setFullMethodName(MethodDescriptor.generateFullMethodName(s.getFullName(), m.getName()))
        .setRequestMarshaller(ProtoUtils.marshaller(request))
        .setResponseMarshaller(ProtoUtils.marshaller(response))
        .build();
  }

  private static CallOptions options() {
    return CallOptions.DEFAULT
        .withDeadlineAfter(TIMEOUT_SECONDS, TimeUnit.SECONDS)
        .withMaxOutboundMessageSize(MAX_MESSAGE);
  }

  private static JsonObject runFunction(Map<String, String> flags) throws Exception {
    String target = need(flags, "target");
    apiextensions.fn.proto.v1alpha1.RunFunction.RunFunctionRequest request =
        apiextensions.fn.proto.v1alpha1.RunFunction.RunFunctionRequest.newBuilder()
            .setImage(need(flags, "image"))
            .setInput(ByteString.copyFrom(stdin()))
            .build();
    try (Conn conn = connect(target, InsecureChannelCredentials.create(), null)) {
      JsonObject result;
      try {
        apiextensions.fn.proto.v1alpha1.RunFunction.RunFunctionResponse response =
            ClientCalls.blockingUnaryCall(
                conn.channel,
                unary(
                    apiextensions.fn.proto.v1alpha1.RunFunction.getDescriptor(),
                    "ContainerizedFunctionRunnerService",
                    "RunFunction",
                    request,
                    apiextensions.fn.proto.v1alpha1.RunFunction.RunFunctionResponse
                        .getDefaultInstance()),
                options(),
                request);
        result = new JsonObject();
        result.addProperty("code", "OK");
        result.addProperty("message", "");
        result.addProperty("output", response.getOutput().toString(StandardCharsets.UTF_8));
      } catch (StatusRuntimeException e) {
        result = failed(e);
        result.addProperty("output", "");
      }
      return result;
    }
  }

  private static JsonObject evaluate(Map<String, String> flags) throws Exception {
    String target = need(flags, "target");
    evaluator.Evaluator.EvaluateFunctionRequest request =
        evaluator.Evaluator.EvaluateFunctionRequest.newBuilder()
            .setImage(need(flags, "image"))
            .setResourceList(ByteString.copyFrom(stdin()))
            .build();
    try (Conn conn = connect(target, InsecureChannelCredentials.create(), null)) {
      JsonObject result;
      try {
        evaluator.Evaluator.EvaluateFunctionResponse response =
            ClientCalls.blockingUnaryCall(
                conn.channel,
                unary(
                    evaluator.Evaluator.getDescriptor(),
                    "FunctionEvaluator",
                    "EvaluateFunction",
                    request,
                    evaluator.Evaluator.EvaluateFunctionResponse.getDefaultInstance()),
                options(),
                request);
        result = new JsonObject();
        result.addProperty("code", "OK");
        result.addProperty("message", "");
        result.addProperty(
            "resource_list", response.getResourceList().toString(StandardCharsets.UTF_8));
        result.addProperty("log", response.getLog().toString(StandardCharsets.UTF_8));
      } catch (StatusRuntimeException e) {
        result = failed(e);
        result.addProperty("resource_list", "");
        result.addProperty("log", "");
      }
      return result;
    }
  }

  /** One request on a server reflection stream, and its one response. */
  private static ServerReflectionResponse reflect(
      ManagedChannel channel, ServerReflectionRequest request) throws Exception {
    CompletableFuture<ServerReflectionResponse> answer = new CompletableFuture<>();
    StreamObserver<ServerReflectionRequest> requests =
        ServerReflectionGrpc.newStub(channel)
            .withDeadlineAfter(TIMEOUT_SECONDS, TimeUnit.SECONDS)
            .serverReflectionInfo(
                new StreamObserver<ServerReflectionResponse>() {
                  @Override
                  public void onNext(ServerReflectionResponse response) {
                    answer.complete(response);
                  }

                  @Override
                  public void onError(Throwable t) {
                    answer.completeExceptionally(t);
                  }

                  @Override
                  public void onCompleted() {
                    answer.completeExceptionally(
                        new IllegalStateException("the stream ended without a response"));
                  }
                });
    requests.onNext(request);
    requests.onCompleted();
    return answer.get(TIMEOUT_SECONDS, TimeUnit.SECONDS);
  }

  private static JsonObject reflection(Map<String, String> flags) throws Exception {
    String target = need(flags, "target");
    String symbol = need(flags, "symbol");
    try (Conn conn = connect(target, InsecureChannelCredentials.create(), null)) {
      JsonArray services = new JsonArray();
      ServerReflectionResponse listed =
          reflect(conn.channel, ServerReflectionRequest.newBuilder().setListServices("").build());
      listed.getListServicesResponse().getServiceList().forEach(s -> services.add(s.getName()));
      ServerReflectionResponse found =
          reflect(
              conn.channel,
              ServerReflectionRequest.newBuilder().setFileContainingSymbol(symbol).build());
      List<ByteString> files = found.getFileDescriptorResponse().getFileDescriptorProtoList();
      if (files.isEmpty()) {
        throw new IllegalStateException("no file defines " + symbol + ": " + found);
      }
      // The first file is the one that defines the symbol; its dependencies follow.
      FileDescriptorProto file = FileDescriptorProto.parseFrom(files.get(0));
      JsonObject fileJson = new JsonObject();
      fileJson.addProperty("name", file.getName());
      fileJson.addProperty("package", file.getPackage());
      JsonObject methods = new JsonObject();
      for (ServiceDescriptorProto service : file.getServiceList()) {
        JsonArray names = new JsonArray();
        for (MethodDescriptorProto method : service.getMethodList()) {
          names.add(method.getName());
        }
        methods.add(service.getName(), names);
      }
      fileJson.add("services", methods);
      JsonObject result = new JsonObject();
      result.add("services", services);
      result.add("file", fileJson);
      return result;
    }
  }

  private static JsonObject crossplaneCall(Map<String, String> flags) throws Exception {
    String target = need(flags, "target");
    String authority = need(flags, "authority");
    apiextensions.fn.proto.v1.RunFunction.RunFunctionRequest.Builder request =
        apiextensions.fn.proto.v1.RunFunction.RunFunctionRequest.newBuilder();
    JsonFormat.parser().merge(new String(stdin(), StandardCharsets.UTF_8), request);
    ChannelCredentials credentials = InsecureChannelCredentials.create();
    if (flags.containsKey("ca")) {
      String host = URI.create("//" + authority).getHost();
      String serverName = need(flags, "server-name");
      if (!serverName.equals(host)) {
        throw new IllegalArgumentException(
            "grpc-java sends the :authority's host ("
                + host
                + ") as the TLS server name, not "
                + serverName);
      }
      TlsChannelCredentials.Builder tls =
          TlsChannelCredentials.newBuilder().trustManager(new File(need(flags, "ca")));
      if (flags.containsKey("cert")) {
        tls.keyManager(new File(need(flags, "cert")), new File(need(flags, "key")));
      }
      credentials = tls.build();
    }
    try (Conn conn = connect(target, credentials, authority)) {
      JsonObject result;
      try {
        apiextensions.fn.proto.v1.RunFunction.RunFunctionRequest built = request.build();
        apiextensions.fn.proto.v1.RunFunction.RunFunctionResponse response =
            ClientCalls.blockingUnaryCall(
                conn.channel,
                unary(
                    apiextensions.fn.proto.v1.RunFunction.getDescriptor(),
                    "FunctionRunnerService",
                    "RunFunction",
                    built,
                    apiextensions.fn.proto.v1.RunFunction.RunFunctionResponse.getDefaultInstance()),
                options(),
                built);
        result = new JsonObject();
        result.addProperty("code", "OK");
        result.addProperty("message", "");
        result.add("response", JsonParser.parseString(JsonFormat.printer().print(response)));
      } catch (StatusRuntimeException e) {
        result = failed(e);
        result.add("response", null);
      }
      return result;
    }
  }
}
