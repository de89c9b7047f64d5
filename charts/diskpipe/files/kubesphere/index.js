// diskpipe's console in KubeSphere's: ks-console loads this file as a SystemJS module (the
// JSBundle "diskpipe", served by ks-apiserver at /dist/diskpipe/index.js) and registers its
// default export, an extension's config. Its one route shows diskpipe's own pages in a frame,
// served by the gateway through the ReverseProxy /proxy/diskpipe/ on the console's origin, so
// the console's session (its cookie, which ks-console turns into the user's token) is the
// pages' too; the ExtensionEntry "diskpipe" puts the route in the console's menu. React is
// the console's own, from its import map.
System.register(['react'], function (_export) {
  'use strict';
  var React;
  return {
    setters: [
      function (m) {
        React = m.default || m;
      },
    ],
    execute: function () {
      // Page is the frame; ?namespace= of the console's address opens that project.
      function Page() {
        var ns = new URLSearchParams(window.location.search).get('namespace');
        var src = '/proxy/diskpipe/' + (ns ? '?namespace=' + encodeURIComponent(ns) : '');
        return React.createElement('iframe', {
          src: src,
          title: 'diskpipe',
          style: { border: 0, width: '100%', height: 'calc(100vh - 68px)' },
        });
      }
      _export('default', {
        routes: [{ path: '/diskpipe', element: React.createElement(Page) }],
        menus: [{ parent: 'global', name: 'diskpipe', link: '/diskpipe', title: 'DISKPIPE_TITLE', icon: 'storage', order: 10, skipAuth: true }],
        locales: { en: { DISKPIPE_TITLE: 'Images and disks' } },
      });
    },
  };
});
